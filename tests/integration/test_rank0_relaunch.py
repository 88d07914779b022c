"""A run survives the death of its rank 0 (gyre_hpc/live/periodic.py + live/supervise.py), through the real runtime
(``gyre train``: mpirun, 1 + 2 ranks, megatron core, local engine, proxy): rank 0 saves RUN_DIR/resume after each
step it applies; the test SIGKILLs rank 0 by PID once its second step is saved, and never passes ``--resume``;
``gyre train`` relaunches the run from that periodic state, and the command ends with every step done, the steps
numbered on from the saved one, exit 0, and no process left."""
import json
import time

import pytest

from gyre_hpc.allocator.eventlog import read_events
from slurm_cluster import mpirun  # noqa: F401  (fixture)
from test_preempt_edges import TIMEOUT_S, assert_one_time_line, cell_rank, gyre_train
from test_relaunch import assert_none_left, kill_and_finish, processes_of

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = 4
KILL_AFTER = 2  # rank 0 dies once its periodic state of this many steps is written


def saved_steps(out, proc) -> int:
    """Wait until rank 0 logged ``resume_saved`` for KILL_AFTER steps; the steps done in its newest state."""
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline and proc.poll() is None:
        logs = list(out.glob("*/events.jsonl"))
        saved = [e["steps_done"] for e in read_events(logs[0]) if e["event"] == "resume_saved"] if logs else []
        if saved and saved[-1] >= KILL_AFTER:
            return saved[-1]
        time.sleep(0.1)
    pytest.fail(f"rank 0 never saved a state of {KILL_AFTER} steps (gyre train exit {proc.poll()})")


def test_sigkill_of_rank_0_after_its_second_step_is_relaunched_from_its_periodic_state(mpirun, tmp_path):
    proc = gyre_train(tmp_path, "rank0", "--set", f"allocator.steps={STEPS}", "--set", "run.resume_every_steps=1")
    rank0 = cell_rank(proc, 0)
    pids = processes_of(proc)
    saved = saved_steps(tmp_path, proc)
    pids |= processes_of(proc)
    code, stdout, stderr = kill_and_finish(proc, rank0, pids)
    assert code == 0, stderr[-4000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and summary["relaunches"] == 1 and summary["segments"] == 2
    assert summary["runs_lost"] == 0
    (run_dir,) = tmp_path.glob("rank0-*")
    events = assert_one_time_line(run_dir)
    kinds = [e["event"] for e in events]
    assert "preempted" not in kinds and "lost_rank_saved" not in kinds  # nothing saved at the end: rank 0 was dead
    (relaunched,) = [e for e in events if e["event"] == "relaunched"]
    (resumed,) = [e for e in events if e["event"] == "resumed"]
    assert relaunched["attempt"] == 1 and relaunched["reason"] in ("rank_lost", "error")
    assert resumed["steps_done"] >= saved  # the newest periodic state (a later step may have saved before the kill)
    after = [e["step"] for e in events[kinds.index("resumed"):] if e["event"] == "train_step"]
    assert after == list(range(resumed["steps_done"] + 1, STEPS + 1))  # numbered on from the saved state
    metrics = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(1, STEPS + 1))
    assert not (run_dir / "resume").exists()  # the run finished: nothing left to resume
    assert_none_left(pids)
