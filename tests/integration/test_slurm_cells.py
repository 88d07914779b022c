"""``gyre submit configs/local_cells.yaml`` on the local SLURM cluster (4 emulated nodes): one srun step holds the
allocator and every worker (1 + 2 cells x 2 nodes x 2 workers = 9 tasks), each on the node the layout gives it
(every rank checks its SLURMD_NODENAME at start); the core trains with TP 2 x DP 2, and the run completes."""
import json
import re
import subprocess
import sys

import pytest

from slurm_cluster import ROOT, local_slurm, wait_for  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_cells_job_runs_every_worker_on_its_node_and_completes(local_slurm, tmp_path):
    out_dir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "submit", "configs/local_cells.yaml", "--set",
           f"run.out_dir={out_dir}", "--set", "allocator.steps=2", "--set", "allocator.hello_timeout_s=600",
           "--set", "engine.startup_timeout_s=600"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout).group(1)
    state, code = wait_for(job_id, timeout=900)
    (run_dir,) = out_dir.glob("local_cells-*")
    err = "".join(p.read_text() for p in run_dir.glob("slurm-*.err"))
    assert (state, code) == ("COMPLETED", 0), err[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["runs_lost"] == 0
    assert summary["parallel"] == {"tp": 2, "pp": 1, "dp": 2} and summary["workers"] == 8
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["cell"]: e["node"] for e in events if e["event"] == "hello"} == {0: "n1", 1: "n3"}  # the leaders
