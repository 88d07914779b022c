"""``agent.kind: mini-swe-agent``: the real, unmodified package (in its own venv) against the proxy's OpenAI endpoint.

The engine is ``ScriptedEngineDouble``. Run r0 replays task t17's reference fix as bash tool calls (look, patch,
then the done signal) and scores 1.0; run r1 tries to write outside its workspace and to open a socket (both
refused by the sandbox, and the run is marked), then writes no tool call once (a format error: mini-swe-agent
drops that reply, a branch point), then submits. The proxy, chat template, mini-swe-agent, the sandbox, the hidden
test grader, the trajectory processor and the trainer are real.

The venv comes from ``bash scripts/setup.sh --mini-swe-agent`` (.ci/run does it): without it these tests FAIL.
"""
import json
from pathlib import Path

import pytest

from gyre_hpc.agents.grader import sandbox_available
from gyre_hpc.agents.mswea import default_venv
from gyre_hpc.agents.plugin_harness import PluginHarness
from gyre_hpc.agents.repo_tasks import load_task
from gyre_hpc.config import ModelConfig, OpenAIConfig, ProxyConfig, TrainConfig, TrajectoryConfig, load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.models.init import init_model
from gyre_hpc.proxy.hf_template import HFChatTemplate
from gyre_hpc.proxy.server import ProxyServer
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.trajectory.branches import BranchKind, classify
from gyre_hpc.trajectory.pipeline import build_batch
from gyre_hpc.trajectory.records import RunStatus, TitoLog, read_tito
from gyre_hpc.trajectory.tree import build_tree
from tests.integration.openai_doubles import ScriptedEngineDouble, ThreadServer

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASK = load_task(ROOT / "tasks" / "t17_dedupe_order")
DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def mswea_venv():
    """The mini-swe-agent venv; missing is a failure (CI installs it), never a skip."""
    python = default_venv() / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"no mini-swe-agent venv at {python.parent.parent}: run `bash scripts/setup.sh --mini-swe-agent`")
    return python


def bash(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mswea_venv):
    tmp = tmp_path_factory.mktemp("mswea")
    model = init_model("qwen3", tmp / "tiny", vocab=1024)
    template = HFChatTemplate(model)
    script = {
        "r0": [bash("cat uniq/dedupe.py"), bash(f"patch -p1 <<'EOF'\n{TASK.patch.read_text()}EOF"), bash(DONE)],
        "r1": [bash("touch /etc/gyre-escape; echo x > ../escape.txt" if sandbox_available() else "true"),
               bash("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)\""),
               "I will just think about it.", bash(DONE)],
    }

    def reply(i, ids, run):
        texts = [bash("sleep 50")] if run.startswith("q00009") else script[run.rpartition("-")[2]]
        return template.encode(texts[min(i, len(texts) - 1)]) + [template.stop_ids[0]]

    engine = ScriptedEngineDouble(reply)
    service = ProxyService(ProxyConfig(openai=OpenAIConfig(tokenizer=str(model)), tito_dir=str(tmp / "tito"),
                                       default_max_new_tokens=1024))  # the patch call is long in a 1k vocab
    service.add_engine(engine.url, 0)
    proxy = ThreadServer(ProxyServer(service).app)
    try:
        yield proxy.url, model, engine
    finally:
        proxy.stop()
        engine.stop()


def mswea_harness(url, out, *sets):
    cfg = load_config(None, ["agent.kind=mini-swe-agent", "agent.runs_per_group=2", "agent.timeout_s=240",
                             f"agent.tasks_dir={ROOT / 'tasks'}", "agent.mini_swe_agent.step_limit=6", *sets])
    return PluginHarness(cfg.agent, cfg.grader, url, out, tasks=[TASK])


@pytest.mark.megatron
def test_mini_swe_agent_replaying_the_reference_fix_scores_one_and_trains(stack, tmp_path):
    url, model, engine = stack
    results = mswea_harness(url, tmp_path / "runs").run([7])
    by_run = {r.run_id: r.outcome for r in results}
    fixed, escaped = by_run["q00007-r0"], by_run["q00007-r1"]
    assert (fixed.status, fixed.score) == (RunStatus.SCORED, 1.0), fixed.detail
    assert "mini-swe-agent Submitted, 3 calls" in fixed.detail
    assert (escaped.status, escaped.score) == (RunStatus.SCORED, 0.0), escaped.detail
    if sandbox_available():
        assert "sandbox refused" in escaped.detail and "network" in escaped.detail
        assert "write outside the workspace" in escaped.detail
        assert not Path("/etc/gyre-escape").exists()

    from gyre_hpc.proxy.client import ProxyClient
    with ProxyClient(url) as proxy:
        done = proxy.flush_tito("q7.jsonl", list(by_run))
    log = read_tito(done["path"], ModelConfig(hf_path=str(model)).vocab_size)
    calls = log.runs["q00007-r0"]
    assert len(calls) == 3  # look, patch, done: no call follows the done signal
    for before, after in zip(calls, calls[1:]):  # token-exact: each call extends the previous prompt + output
        assert after.input_ids[:len(before.sequence)].tolist() == before.sequence.tolist()
    kinds = [b.kind for b in classify(build_tree(log.runs["q00007-r1"]), log.runs["q00007-r1"])]
    assert kinds == [BranchKind.ROOT, BranchKind.CONTINUATION, BranchKind.CONTINUATION, BranchKind.RETRY]

    batch, report = build_batch(TitoLog(log.calls, log.outcomes), TrajectoryConfig(max_row_tokens=16384))
    assert report.trained_tokens > 0
    from gyre_hpc.train.step import Trainer
    trainer = Trainer(ModelConfig(hf_path=str(model)), TrainConfig(lr=1e-3))
    assert trainer.step(batch)["trained_tokens"] == report.trained_tokens


def test_a_hung_mini_swe_agent_run_times_out_and_is_graded_partially(stack, tmp_path):
    url, _, _ = stack
    # each command sleeps past the whole run's limit: the run's process group is killed, the workspace graded
    results = mswea_harness(url, tmp_path / "runs", "agent.timeout_s=15",
                            "agent.mini_swe_agent.command_timeout_s=60").run([9])
    assert [(r.outcome.status, r.outcome.score) for r in results] == [(RunStatus.TIMEOUT_PARTIAL, 0.0)] * 2
    assert all("ran past 15 s" in r.outcome.detail for r in results)


def test_a_missing_venv_is_a_config_error_naming_the_setup_command(tmp_path):
    cfg = load_config(None, ["agent.kind=mini-swe-agent", f"agent.tasks_dir={ROOT / 'tasks'}",
                             f"agent.mini_swe_agent.python={tmp_path / 'nope' / 'python'}"])
    with pytest.raises(ConfigError, match="setup.sh --mini-swe-agent"):
        PluginHarness(cfg.agent, cfg.grader, "http://127.0.0.1:1", tmp_path, tasks=[TASK])
