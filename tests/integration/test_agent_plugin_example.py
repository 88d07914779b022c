"""The example plugin of docs/agents.md, run through the plugin mechanics against a scripted chat-completions double.

``ScriptedChat`` stands in for the proxy's OpenAI endpoint (not built yet): it answers the first call with a bash
tool call that applies the task's reference patch and the second with a plain reply, and records every request.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gyre_hpc.agents.plugins import grade_run, load_plugins, run_agent, run_status
from gyre_hpc.agents.repo_tasks import load_task, make_workspace
from gyre_hpc.config import load_config
from gyre_hpc.trajectory.records import RunStatus

ROOT = Path(__file__).resolve().parents[2]


class ScriptedChat(ThreadingHTTPServer):
    """A double of the OpenAI endpoint: replies[i] answers the i-th call; requests are kept as (path, auth, body)."""

    def __init__(self, replies):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies, self.requests = list(replies), []


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, self.headers["Authorization"], body))
        message = self.server.replies[len(self.server.requests) - 1]
        data = json.dumps({"id": "c", "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_double(request):
    server = ScriptedChat(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


TASK = load_task(ROOT / "tasks" / "t17_dedupe_order")
FIX = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "bash", "arguments": json.dumps({"command": f"patch -p1 < {TASK.patch}"})}}]}
DONE = {"role": "assistant", "content": "Fixed: dedupe keeps the first-occurrence order."}


@pytest.mark.parametrize("chat_double", [[FIX, DONE]], indirect=True)
def test_example_plugin_fixes_a_task_through_the_chat_api_and_scores_one(chat_double, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples"))
    cfg = load_config(None, ["agent.kind=python", "agent.entry=agent_plugin:run", "agent.tasks_dir=tasks",
                             "grader.entry=agent_plugin:grade"])
    plugins = load_plugins(cfg.agent, cfg.grader)
    base_url = f"http://127.0.0.1:{chat_double.server_address[1]}/runs/r1/v1"
    workspace = make_workspace(TASK, tmp_path)
    result = run_agent(plugins, TASK, base_url, "sk-r1", workspace, timeout_s=60)
    assert result.status == "finished", result.detail
    (p1, auth1, first), (p2, auth2, second) = chat_double.requests
    assert p1 == p2 == "/runs/r1/v1/chat/completions" and auth1 == auth2 == "Bearer sk-r1"
    assert first["messages"][1] == {"role": "user", "content": TASK.statement}
    assert second["messages"][:2] == first["messages"] and second["messages"][2] == FIX
    assert second["messages"][3]["role"] == "tool" and second["messages"][3]["tool_call_id"] == "call_1"
    grade = grade_run(plugins, TASK, workspace)
    assert (grade.status, grade.score) == (RunStatus.SCORED, 1.0)
    assert run_status(result, grade) is RunStatus.SCORED
