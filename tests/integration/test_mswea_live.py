"""``gyre train configs/swe_local.yaml`` live: mini-swe-agent (the real package, its venv) with a tiny Qwen3 model.

The random model rarely writes a valid tool call, so runs end on format errors or the step limit and score 0;
what is checked is that the live run finishes its 2 steps with every run graded (none lost, no eval failure),
its calls recorded through the OpenAI endpoint, and mini-swe-agent's own exit named in each outcome.
"""
import json
from pathlib import Path

import pytest
from live_run import run_live

from gyre_hpc.agents.mswea import default_venv
from gyre_hpc.models.init import init_model
from gyre_hpc.trajectory.records import RunStatus, read_tito

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow, pytest.mark.timeout(1800)]

TIMEOUT_S = 1500


def test_gyre_train_swe_mswea_runs_mini_swe_agent_for_two_steps(tmp_path):
    if not (default_venv() / "bin" / "python").is_file():  # CI installs it: missing is a failure, never a skip
        pytest.fail("no mini-swe-agent venv: run `bash scripts/setup.sh --mini-swe-agent`")
    model = init_model("qwen3", tmp_path / "tiny-qwen3", vocab=1024, context=16384)
    overrides = [f"model.hf_path={model}", "scheduler.batch_groups=1", "agent.timeout_s=240",  # 2 steps of 1 group
                 "engine.sleep_in_training=true"]  # no engine restart per switch (CPU); restarts: test_live_training
    summary, _, _ = run_live(tmp_path / "runs", overrides, config="swe_local.yaml", timeout_s=TIMEOUT_S)
    assert summary["steps"] == 2 and summary["runs_lost"] == 0
    steps = [json.loads(line) for line in Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()]
    assert sum(s["trained_tokens"] for s in steps) > 0  # the recorded calls reached the trainer
    assert set(summary["run_statuses"]) <= {RunStatus.SCORED.value, RunStatus.TIMEOUT_PARTIAL.value}
    files = sorted(Path(summary["run_dir"], "tito").glob("q*.jsonl"))
    assert files
    logs = [read_tito(path) for path in files]
    assert any(log.calls for log in logs)  # a run cut at agent.timeout_s before its first reply has no call
    for log in logs:
        assert {c.run_id for c in log.calls} <= set(log.outcome) and log.outcomes
        assert all(c.call_id.startswith("oa") for c in log.calls)  # recorded by the OpenAI endpoint
        assert all("mini-swe-agent" in o.detail for o in log.outcomes), [o.detail for o in log.outcomes]
    # runs end on mini-swe-agent's own exit (step_limit, format errors, submit), not on agent.timeout_s: with the
    # engine's KV cache (configs/swe_local.yaml) a call takes seconds; without it every run here hit the timeout
    details = [o.detail for log in logs for o in log.outcomes]
    assert any("agent finished: mini-swe-agent" in d for d in details), details
