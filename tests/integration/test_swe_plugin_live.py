"""``gyre train configs/swe_plugin.yaml`` live: the example plugin agent on the shipped tasks with a tiny Qwen3 model.

The random model writes no tool call, so every run scores 0 (and its group trains no token); what is checked is
that the live run finishes its 2 steps with every run graded, its calls recorded through the OpenAI endpoint,
and nothing lost.
"""
from pathlib import Path

import pytest
from live_run import ROOT, run_live

from gyre_hpc.models.init import init_model
from gyre_hpc.trajectory.records import RunStatus, read_tito

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

TIMEOUT_S = 1200


def test_gyre_train_swe_plugin_runs_the_plugin_agent_for_two_steps(tmp_path):
    model = init_model("qwen3", tmp_path / "tiny-qwen3", vocab=1024)
    overrides = [f"model.hf_path={model}",
                 "engine.sleep_in_training=true"]  # no engine restart per switch (CPU); restarts: test_live_training
    summary, _, _ = run_live(tmp_path / "runs", overrides, config="swe_plugin.yaml", timeout_s=TIMEOUT_S,
                             path=[str(ROOT / "docs" / "examples")])  # the plugin
    assert summary["steps"] == 2 and summary["runs_lost"] == 0
    assert set(summary["run_statuses"]) <= {RunStatus.SCORED.value, RunStatus.TIMEOUT_PARTIAL.value}
    files = sorted(Path(summary["run_dir"], "tito").glob("q*.jsonl"))
    assert files
    for path in files:
        log = read_tito(path)
        assert log.calls and {c.run_id for c in log.calls} == set(log.outcome)
        assert all(c.call_id.startswith("oa") for c in log.calls)  # recorded by the OpenAI endpoint
