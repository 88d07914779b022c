"""Run the elements of a sweep with submitit and wait for them with a progress line (the edge of ``gyre sweep``).

On SLURM the elements are ONE job array (``executor.map_array``; elements whose SLURM resources differ, e.g. a
grid over ``cluster.cells``, go into one array per distinct resource set). With the local executor elements
start as earlier ones end, at most ``parallel`` at a time (a training element alone runs 1 + K processes).

Invariants
- Every element ends with exactly one ``ElementOutcome``: COMPLETED with its metrics, or its end state (FAILED,
  CANCELLED, TIMEOUT, ...) with the error or the tail of its stderr; an exception in one element never hides
  the others.
- The progress line counts done / running / failed from result files and one scheduler query per poll.
"""
from __future__ import annotations

import json
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.slurm.submit import make_executor, normal_state
from gyre_hpc.sweep import COMPLETED, ElementOutcome

#: summary keys of a training run that become columns of the sweep table
TRAIN_COLUMNS = ("steps", "wall_s", "reward_first", "reward_last", "staleness_mean", "staleness_max",
                 "switches_r2t", "switches_t2r", "runs_finished", "runs_lost", "run_dir")


@dataclass
class SweepJob:
    """One element to run: ``fn(*args)`` with these executor keywords."""

    index: int
    fn: Callable[..., Any]
    args: tuple
    params: dict[str, Any]
    job: Any = None
    outcome: ElementOutcome | None = field(default=None)


def train_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary.get(k) for k in TRAIN_COLUMNS}


def _submit_arrays(tasks: Sequence[SweepJob], kind: str, folder: Path, parallel: int) -> None:
    groups: dict[str, list[SweepJob]] = {}
    for t in tasks:
        groups.setdefault(json.dumps(t.params, sort_keys=True, default=str), []).append(t)
    for group in groups.values():
        params = {**group[0].params, "slurm_array_parallelism": parallel}
        ex = make_executor(kind, folder, params)
        jobs = ex.map_array(group[0].fn, *zip(*[t.args for t in group]))
        for t, job in zip(group, jobs):
            t.job = job


def _finished(t: SweepJob) -> bool:
    """Has the job ended? (Its result file, else the scheduler's last answer.)"""
    return t.job is not None and t.job.done()


def _quick_outcome(t: SweepJob, metrics: Callable[[Any], dict[str, Any]]) -> ElementOutcome | None:
    """The outcome from the result file, without waiting; None when the job left no result (crash, cancel)."""
    path = t.job.paths.result_pickle
    if not path.exists():
        return None
    with open(path, "rb") as f:
        status, value = pickle.load(f)
    if status == "success":
        return ElementOutcome(COMPLETED, metrics(value), job_id=str(t.job.job_id))
    return ElementOutcome("FAILED", {}, str(value), job_id=str(t.job.job_id))


def _slow_outcome(t: SweepJob, kind: str) -> ElementOutcome:
    """A job that ended without a result file: submitit's own error (it waits for a late file) + stderr."""
    try:
        t.job.result()
        raise RuntimeError("the job returned after all")  # pragma: no cover - a late result file
    except Exception as exc:  # noqa: BLE001 - every way an element can fail is reported, not raised
        raw = t.job.watcher.get_state(t.job.job_id, mode="force") if kind == "slurm" else t.job.state
        state = normal_state(raw, kind, False)
        stderr = t.job.stderr() or ""
        return ElementOutcome(state if state != COMPLETED else "FAILED", {}, f"{exc}\n{stderr[-2000:]}",
                       job_id=str(t.job.job_id))


def run_tasks(tasks: Sequence[SweepJob], kind: str, folder: Path, parallel: int,
              metrics: Callable[[Any], dict[str, Any]], poll_s: float = 1.0,
              clock: Clock | None = None) -> list[ElementOutcome]:
    """Submit every task, show progress until all have ended, and return their outcomes in task order."""
    from tqdm import tqdm

    if kind == "slurm":
        _submit_arrays(tasks, kind, folder, parallel)
    waiting = [t for t in tasks if t.job is None]
    bar = tqdm(total=len(tasks), desc="sweep", unit="element", file=sys.stderr, disable=None)
    failed = 0
    while any(t.outcome is None for t in tasks):
        while waiting and sum(t.job is not None and t.outcome is None for t in tasks) < parallel:
            t = waiting.pop(0)
            t.job = make_executor(kind, folder, t.params).submit(t.fn, *t.args)
        ended = [t for t in tasks if t.outcome is None and _finished(t)]
        quick = {t.index: _quick_outcome(t, metrics) for t in ended}
        crashed = [t for t in ended if quick[t.index] is None]
        with ThreadPoolExecutor(max(1, len(crashed))) as pool:  # submitit waits 15 s for a late result file
            late = dict(zip([t.index for t in crashed], pool.map(lambda t: _slow_outcome(t, kind), crashed)))
        for t in ended:
            t.outcome = quick[t.index] or late[t.index]
        failed += sum(t.outcome.status != COMPLETED for t in ended)
        bar.update(len(ended))
        running = sum(t.job is not None and t.outcome is None for t in tasks)
        bar.set_postfix_str(f"running {running}, failed {failed}, queued {len(waiting)}")
        if any(t.outcome is None for t in tasks):
            (clock or WallClock()).sleep(poll_s)
    bar.close()
    return [t.outcome for t in tasks]

