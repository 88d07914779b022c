"""``gyre train configs/swe_plugin.yaml`` live: the example plugin agent on the shipped tasks with a tiny Qwen3 model.

The random model writes no tool call, so every run scores 0 (and its group trains no token); what is checked is
that the live run finishes its 2 steps with every run graded, its calls recorded through the OpenAI endpoint,
and nothing lost.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from live_run import launcher_env

from gyre_hpc.models.init import init_model
from gyre_hpc.trajectory.records import RunStatus, read_tito

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1200


def test_gyre_train_swe_plugin_runs_the_plugin_agent_for_two_steps(tmp_path):
    model = init_model("qwen3", tmp_path / "tiny-qwen3", vocab=1024)
    env = launcher_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT / "docs" / "examples")])  # the plugin
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(ROOT / "configs" / "swe_plugin.yaml"), "--json",
           "--set", f"run.out_dir={tmp_path / 'runs'}", "--set", f"model.hf_path={model}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # gyre train dumps its ranks' stacks and ends mpirun's session
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"the live run did not finish in {TIMEOUT_S} s:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["runs_lost"] == 0
    assert set(summary["run_statuses"]) <= {RunStatus.SCORED.value, RunStatus.TIMEOUT_PARTIAL.value}
    files = sorted(Path(summary["run_dir"], "tito").glob("q*.jsonl"))
    assert files
    for path in files:
        log = read_tito(path)
        assert log.calls and {c.run_id for c in log.calls} == set(log.outcome)
        assert all(c.call_id.startswith("oa") for c in log.calls)  # recorded by the OpenAI endpoint
