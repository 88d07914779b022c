"""A rank that fails ends the whole live run at once: MPI_Abort, a non-zero exit and the reason on stderr,
instead of the other ranks waiting for it forever (gyre_hpc/live/rank.py ``_abort_world_on_error``)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import mpirun  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_rank_zero_failing_before_the_cells_start_ends_the_run_with_its_reason(tmp_path, mpirun):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(ROOT / "configs" / "local.yaml"),
           "--set", f"run.out_dir={tmp_path}", "--set", "cluster.cells=2",
           "--set", "proxy.startup_timeout_s=0.001"]  # the proxy cannot be ready that soon: rank 0 raises
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 70, done.stderr[-3000:]  # lifecycle.recovery.ERROR_EXIT: an error, not a lost rank
    assert "rank 0 failed; ending the MPI world" in done.stderr
    assert "not ready after 0 s" in done.stderr  # the cause, from rank 0's traceback
    assert "without a summary" in done.stderr  # the launcher says where to look
    assert "gyre train: error: " in done.stderr
    (events,) = tmp_path.glob("*/events.jsonl")
    last = json.loads(events.read_text().splitlines()[-1])
    assert last["event"] == "error" and "not ready after 0 s" in last["error"]
    assert time.monotonic() - t0 < 300
