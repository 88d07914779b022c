"""The allocator over real Open MPI: ``mpirun -n 4`` runs the real server on rank 0 and three cell leaders.

The job script (mpi_allocator_job.py) uses the real MpiTransport, AllocatorServer, policy and CellLink; only
what a cell does inside a switch or a training step is minimal (the real cell worker is a later piece).
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_hpc.allocator.eventlog import read_events
from slurm_cluster import mpirun, mpirun_env  # noqa: F401  (fixture)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JOB = HERE / "mpi_allocator_job.py"
pytestmark = pytest.mark.mpi


def launch(mpirun, n: int, *args: str, timeout: float = 120, recovery: bool = True) -> subprocess.CompletedProcess:
    """mpirun the job. ``--enable-recovery`` lets the other ranks live on when one dies, but then mpirun exits 0
    whatever the ranks' statuses: success is read from rank 0's printed summary and the event log."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.fail("mpi4py is not installed: pip install mpi4py (binary wheel; the .[mpi] extra)", pytrace=False)
    env = mpirun_env(OMPI_MCA_btl="self,tcp")
    cmd = [mpirun, "--oversubscribe", *(["--enable-recovery"] if recovery else []), "-n", str(n), sys.executable,
           str(JOB), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def outputs(out: subprocess.CompletedProcess) -> dict[int, dict]:
    """Every rank's JSON summary. mpirun forwards the ranks' output in chunks, so two summaries can arrive on
    one line: decode objects wherever they start instead of line by line."""
    decoder, text, found = json.JSONDecoder(), out.stdout, []
    start = text.find('{"rank"')
    while start != -1:
        obj, end = decoder.raw_decode(text, start)
        found.append(obj)
        start = text.find('{"rank"', end)
    return {r["rank"]: r for r in found}


def test_allocator_and_three_cells_exchange_real_messages_and_shut_down_in_order(mpirun, tmp_path):
    events = tmp_path / "events.jsonl"
    out = launch(mpirun, 4, "--events", str(events), "--steps", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    got = outputs(out)
    assert sorted(got) == [0, 1, 2, 3] and {r["size"] for r in got.values()} == {4}
    assert got[0]["summary"] == {"reason": "3 optimizer steps done", "steps_done": 3, "version": 3, "lost": [],
                                 "no_bye": []}
    core = got[1]
    assert core["orders"] == ["Welcome"] + ["SwitchTo"] * 5 + ["Shutdown"] and core["version"] == 3
    assert got[2]["orders"] == got[3]["orders"] == ["Welcome", "Shutdown"]
    assert all(got[r]["heartbeats"] >= 1 and got[r]["lost"] == [] for r in (1, 2, 3))

    log = read_events(events)
    kinds = [r["event"] for r in log]
    assert kinds[0] == "start" and kinds[-1] == "stop"
    assert sorted((r["cell"], r["rank"]) for r in log if r["event"] == "hello") == [(0, 1), (1, 2), (2, 3)]
    switches = [(r["cell"], r["target"]) for r in log if r.get("order") == "switch"]
    assert switches == [(0, "train"), (0, "rollout"), (0, "train"), (0, "rollout"), (0, "train")]
    done = [r for r in log if r["event"] == "switch_done"]
    assert len(done) == 5 and all(set(r["timing"]) == {"drain_s", "engine_stop_s"} and r["total_s"] > 0
                                  for r in done)
    assert [r["version"] for r in log if r["event"] == "step"] == [1, 2, 3]
    assert kinds[-5:-1] == ["shutdown", "bye", "bye", "bye"] and "lost" not in kinds and "rejected" not in kinds


def test_a_cell_rank_that_dies_is_lost_and_the_job_still_ends_cleanly(mpirun, tmp_path):
    events = tmp_path / "events.jsonl"
    out = launch(mpirun, 4, "--events", str(events), "--die-cell", "2", "--steps", "8", "--switch-s", "0.25",
                 "--heartbeat-timeout-s", "1.5")
    assert out.returncode == 0, out.stderr[-3000:]
    got = outputs(out)
    assert sorted(got) == [0, 1, 2]  # rank 3 (cell 2) was killed
    assert got[1]["lost"] == got[2]["lost"] == [2]  # so no survivor calls MPI_Finalize (exit_process)
    assert got[0]["summary"] == {"reason": "8 optimizer steps done", "steps_done": 8, "version": 8, "lost": [2],
                                 "no_bye": []}
    log = read_events(events)
    (lost,) = [r for r in log if r["event"] == "lost"]
    assert lost["cell"] == 2 and lost["reason"].startswith("heartbeat") and lost["silent_s"] >= 1.5
    after = [r for r in log if r["t"] >= lost["t"]]
    assert all(r.get("cell") != 2 for r in after if r["event"] in ("order", "bye"))
    assert sorted(r["cell"] for r in log if r["event"] == "bye") == [0, 1]
    stop = log[-1]
    assert stop["event"] == "stop" and stop["t"] - lost["t"] < 60


def test_a_world_of_the_wrong_size_is_refused_on_every_rank(mpirun, tmp_path):
    out = launch(mpirun, 3, "--events", str(tmp_path / "events.jsonl"), "--cells", "3", timeout=60, recovery=False)
    assert out.returncode != 0
    assert "LayoutError: the MPI world has 3 ranks, the layout needs 4" in out.stderr
    assert not (tmp_path / "events.jsonl").exists()
