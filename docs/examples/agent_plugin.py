"""An example agent plugin and grader plugin (docs/agents.md). Stdlib only; use with
``agent.kind: python``, ``agent.entry: "agent_plugin:run"`` and ``grader.entry: "agent_plugin:grade"``."""
import json
import subprocess
import urllib.request

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SYSTEM = "Fix the bug in the repository in your working directory with the bash tool. Reply without a tool when done."


def chat(base_url, api_key, messages):
    body = json.dumps({"model": "policy", "messages": messages, "tools": TOOLS}).encode()
    req = urllib.request.Request(f"{base_url}/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)["choices"][0]["message"]


def run(task, base_url, api_key, workspace, max_steps=20):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.statement}]
    for _ in range(max_steps):
        reply = chat(base_url, api_key, messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return
        for call in reply["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(command, shell=True, cwd=workspace, capture_output=True, text=True, timeout=60)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": (done.stdout + done.stderr)[-4000:]})


def grade(task, workspace):
    """Partial credit from the task's hidden tests (gyre's sandboxed grader); raising makes it an eval_failure."""
    from gyre_hpc.agents.grader import grade_hidden_tests
    from gyre_hpc.config import GraderConfig

    result = grade_hidden_tests(task, workspace, GraderConfig(timeout_s=30))
    if result.score is None:
        raise RuntimeError(result.detail)
    return result.score
