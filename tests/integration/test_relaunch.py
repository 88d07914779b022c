"""A run survives losing a cell's rank without anyone resuming it (gyre_hpc/live/supervise.py), through the real
runtime (``gyre train``: mpirun, 1 + 2 ranks, megatron core, local engine, proxy): the test SIGKILLs one cell's
rank mid-run and never passes ``--resume``; ``gyre train`` relaunches the run from rank 0's resume state, the lost
cell starts again with the others, and the command ends with every step done, exit 0, and no process left."""
import json
import threading
import time

import psutil
import pytest

from slurm_cluster import mpirun  # noqa: F401  (fixture)
from test_preempt_edges import STEPS, assert_one_time_line, cell_rank, finish, gyre_train

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.slow, pytest.mark.timeout(1500)]


def processes_of(proc) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.Error:
        return set()


def test_sigkill_of_a_cell_rank_mid_run_is_relaunched_and_the_run_finishes_with_no_orphans(mpirun, tmp_path):
    steps = 2 * STEPS  # the kill lands mid-run
    proc = gyre_train(tmp_path, "relaunch", "--set", f"allocator.steps={steps}")
    pids = until_first_step(proc, tmp_path)
    victim = cell_rank(proc, 2)  # rank 2 = cell 1, the rollout cell (async_train_cells=1: cell 0 is the core)
    pids |= processes_of(proc)
    code, stdout, stderr = kill_and_finish(proc, victim, pids)
    assert code == 0, stderr[-4000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["runs_lost"] == 0
    assert summary["relaunches"] == 1 and summary["segments"] == 2
    (run_dir,) = tmp_path.glob("relaunch-*")
    events = assert_one_time_line(run_dir)
    kinds = [e["event"] for e in events]
    assert "preempted" not in kinds
    (relaunched,) = [e for e in events if e["event"] == "relaunched"]
    assert {k: relaunched[k] for k in ("attempt", "after_exit", "reason")} == {
        "attempt": 1, "after_exit": 69, "reason": "rank_lost"}
    assert kinds.index("lost_rank_saved") < kinds.index("rank_lost") < kinds.index("relaunched") < \
        kinds.index("resumed")
    assert "gyre train: relaunching the run" in stderr
    assert not (run_dir / "resume").exists()  # the run finished: nothing left to resume
    # the killed rank could not clean up: its engines' configs are in its cell directory, not in the temporary one,
    # each named after its engine's log
    cell = run_dir / "cells" / "cell1"
    configs = {p.stem for p in cell.glob("engine-*.yaml")}
    assert configs and configs == {p.stem for p in cell.glob("engine-*.log")}
    assert json.loads((run_dir / "summary.json").read_text())["relaunches"] == 1
    assert_none_left(pids)


def test_sigkill_of_a_worker_of_the_core_cell_is_a_lost_cell_rank_relaunched_like_any_other(mpirun, tmp_path):
    """Cells of two workers (world 1 + 2 x 2): the core's worker 1 (world rank 2, no leader) dies mid-run; its
    leader is in the cell's gloo world, the allocator never talked to it: the run relaunches all the same."""
    steps = 2 * STEPS
    proc = gyre_train(tmp_path, "worker", "--set", f"allocator.steps={steps}", "--set", "cluster.workers_per_node=2")
    pids = until_first_step(proc, tmp_path)
    victim = cell_rank(proc, 2)  # world rank 2 = cell 0's worker 1: the core's second data-parallel replica
    pids |= processes_of(proc)
    code, stdout, stderr = kill_and_finish(proc, victim, pids)
    assert code == 0, stderr[-4000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["runs_lost"] == 0
    assert summary["relaunches"] == 1 and summary["parallel"] == {"tp": 1, "pp": 1, "dp": 2}
    (run_dir,) = tmp_path.glob("worker-*")
    kinds = [e["event"] for e in assert_one_time_line(run_dir)]
    assert kinds.index("rank_lost") < kinds.index("relaunched") < kinds.index("resumed")
    assert_none_left(pids)


def until_first_step(proc, out) -> set[int]:
    """Wait until the run under ``out`` has done its first step; every process of the run seen meanwhile."""
    pids: set[int] = set()
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        pids |= processes_of(proc)
        metrics = list(out.glob("*/metrics.jsonl"))
        if metrics and metrics[0].read_text().splitlines():
            break
        time.sleep(0.2)
    return pids


def kill_and_finish(proc, victim, pids: set[int]) -> tuple[int, str, str]:
    """SIGKILL ``victim`` (a rank), then wait for ``gyre train``; ``pids`` gathers every process of the run
    meanwhile (the relaunched segment's too). ``finish``'s (exit code, stdout, stderr)."""
    victim.kill()
    watching = threading.Event()
    watcher = threading.Thread(target=_watch, args=(proc, pids, watching), daemon=True)
    watcher.start()  # the relaunched segment's processes too, while finish() reads the output
    out = finish(proc)
    watching.set()
    watcher.join()
    return out


def assert_none_left(pids: set[int]) -> None:
    """The no-orphan guarantee (docs/reliability.md): none of ``pids`` alive 10 s after the run ended."""
    ended = time.monotonic()
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() - ended < 10.0:
        time.sleep(0.2)
        left = [p for p in left if _alive(p)]
    assert left == [], f"processes of the run still alive 10 s after it ended: {left}"


def _watch(proc, pids: set[int], done: threading.Event) -> None:
    while not done.is_set() and proc.poll() is None:
        pids |= processes_of(proc)
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
