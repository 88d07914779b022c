"""Plugin agents in the live harness end to end: harness → proxy (OpenAI endpoint) → grader → trajectory → trainer.

The agent is the unmodified example plugin of docs/agents.md (it speaks chat completions with a bash tool). The
engine is ``ScriptedEngineDouble``: for run r0 it replays the task's reference solution as a Qwen tool call
(``patch -p1 < fix.patch``) and then says it is done; for run r1 it gives up at once. The proxy, the chat book,
the tokenizer, the sandboxed hidden-test grader, the trajectory processor and the megatron trainer are real.
"""
import json
from pathlib import Path

import pytest

from gyre_hpc.agents.plugin_harness import PluginHarness, run_api_key, run_base_url
from gyre_hpc.agents.repo_tasks import load_task
from gyre_hpc.config import ModelConfig, OpenAIConfig, ProxyConfig, TrainConfig, TrajectoryConfig, load_config
from gyre_hpc.models.init import init_model
from gyre_hpc.proxy.hf_template import HFChatTemplate
from gyre_hpc.proxy.server import ProxyServer
from gyre_hpc.proxy.service import ProxyService
from gyre_hpc.trajectory.pipeline import build_batch
from gyre_hpc.trajectory.records import RunStatus, TitoLog, read_tito
from tests.integration.openai_doubles import ScriptedEngineDouble, ThreadServer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASK = load_task(ROOT / "tasks" / "t17_dedupe_order")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A tiny Qwen3 model dir, the engine double, the proxy with its OpenAI endpoint; yields (url, model, engine)."""
    tmp = tmp_path_factory.mktemp("plugin")
    model = init_model("qwen3", tmp / "tiny", vocab=1024)
    template = HFChatTemplate(model)
    fix = json.dumps({"name": "bash", "arguments": {"command": f"patch -p1 < {TASK.patch}"}})
    script = {"r0": [f"<tool_call>\n{fix}\n</tool_call>", "Fixed: dedupe keeps the first-occurrence order."],
              "r1": ["I cannot fix this."]}

    def reply(i, ids, run):
        texts = script[run.rpartition("-")[2]]
        return template.encode(texts[min(i, len(texts) - 1)]) + [template.stop_ids[0]]

    engine = ScriptedEngineDouble(reply)
    service = ProxyService(ProxyConfig(openai=OpenAIConfig(tokenizer=str(model)), tito_dir=str(tmp / "tito")))
    service.add_engine(engine.url, 0)
    proxy = ThreadServer(ProxyServer(service).app)
    try:
        yield proxy.url, model, engine
    finally:
        proxy.stop()
        engine.stop()


def harness(url, out, monkeypatch, agent="agent_plugin:run", grader=None, timeout_s=120.0):
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "unit"))
    sets = ["agent.kind=python", f"agent.entry={agent}", "agent.runs_per_group=2", f"agent.timeout_s={timeout_s}",
            f"agent.tasks_dir={ROOT / 'tasks'}"] + ([f"grader.entry={grader}"] if grader else [])
    cfg = load_config(None, sets)
    return PluginHarness(cfg.agent, cfg.grader, url, out, tasks=[TASK])


@pytest.mark.megatron
def test_a_replayed_reference_solution_scores_one_and_trains(stack, tmp_path, monkeypatch):
    url, model, engine = stack
    results = harness(url, tmp_path / "runs", monkeypatch).run([7])
    by_run = {r.run_id: r.outcome for r in results}
    assert (by_run["q00007-r0"].status, by_run["q00007-r0"].score) == (RunStatus.SCORED, 1.0)
    assert (by_run["q00007-r1"].status, by_run["q00007-r1"].score) == (RunStatus.SCORED, 0.0)
    assert all(r.post_error is None for r in results)
    first = [b for b in engine.seen if b["rid"].startswith("q00007-r0/")]
    assert len(first) == 2  # the fix (a tool call), then "done"

    from gyre_hpc.proxy.client import ProxyClient
    with ProxyClient(url) as proxy:
        done = proxy.flush_tito("q7.jsonl", list(by_run))  # into the proxy's tito_dir
    log = read_tito(done["path"], ModelConfig(hf_path=str(model)).vocab_size)
    assert {o.run_id: o.score for o in log.outcomes} == {"q00007-r0": 1.0, "q00007-r1": 0.0}
    calls = log.runs["q00007-r0"]
    assert calls[1].input_ids[:len(calls[0].sequence)].tolist() == calls[0].sequence.tolist()
    batch, report = build_batch(TitoLog(log.calls, log.outcomes), TrajectoryConfig())
    assert report.trained_tokens > 0

    from gyre_hpc.train.step import Trainer
    trainer = Trainer(ModelConfig(hf_path=str(model)), TrainConfig(lr=1e-3))
    stats = trainer.step(batch)
    assert trainer.version == 1 and stats["trained_tokens"] == report.trained_tokens


def test_a_crashing_grader_is_an_eval_failure_and_a_hanging_agent_is_graded_partially(stack, tmp_path, monkeypatch):
    url, _, _ = stack
    failed = harness(url, tmp_path / "a", monkeypatch, grader="agent_plugins:grade_raising").run([8])
    assert {r.outcome.status for r in failed} == {RunStatus.EVAL_FAILURE}
    assert all(r.outcome.score is None and "grader bug" in r.outcome.detail for r in failed)
    hung = harness(url, tmp_path / "b", monkeypatch, agent="agent_plugins:hanging_agent", timeout_s=1.0).run([9])
    assert [(r.outcome.status, r.outcome.score) for r in hung] == [(RunStatus.TIMEOUT_PARTIAL, 0.0)] * 2
    assert all(read_tito(r.path).outcomes[0].status is r.outcome.status for r in hung)


def test_each_run_gets_its_own_base_url_and_key():
    assert run_base_url("http://127.0.0.1:5/", "q1-r0") == "http://127.0.0.1:5/runs/q1-r0/v1"
    assert run_api_key("q1-r0") != run_api_key("q1-r1")


def test_gyre_train_refuses_a_plugin_agent_without_a_chat_template(monkeypatch):
    from jobs.train import _check_plugin_agent
    from gyre_hpc.errors import ConfigError

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "unit"))
    cfg = load_config(None, ["agent.kind=python", "agent.entry=agent_plugins:fixing_agent", "agent.tasks_dir=tasks"])
    with pytest.raises(ConfigError, match="model.hf_path"):
        _check_plugin_agent(cfg)
    _check_plugin_agent(load_config(None, ["agent.kind=python", "agent.entry=agent_plugins:fixing_agent",
                                           "agent.tasks_dir=tasks", "proxy.openai.tokenizer=/some/model"]))
