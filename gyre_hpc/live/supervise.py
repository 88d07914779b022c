"""``gyre train`` supervising its own launch: a run that lost a cell's rank is launched again from its resume state.

::

    gyre train CONFIG                                   (jobs/train.py; the launcher: live/launch.py)
      segment 1   mpirun 1 + K ranks ... a cell's rank dies; rank 0 saves RUN_DIR/resume (live/lost.py); exit 69
                  event  relaunched {attempt: 1, after_exit: 69, reason: "rank_lost"}
      segment 2   mpirun 1 + K ranks on the same RUN_DIR (a rank started on a RUN_DIR with a resume state resumes):
                  every cell starts again, the one whose rank was lost included: that is the cell rejoining
      ...         exit 0, the summary with ``relaunches``

    rank 0 itself dies (SIGKILL, OOM): nothing saves at the end, but rank 0 saved RUN_DIR/resume every
    ``run.resume_every_steps`` steps (live/periodic.py, event ``resume_saved``); mpirun exits non-zero with no
    summary (``on_failure``: 69, or 70 if another rank left an error), and the run is relaunched from that state

Invariants (tests/unit/test_supervise.py, tests/integration/test_relaunch.py)
- Whether a segment is relaunched is ``gyre_hpc.lifecycle.recovery.decide`` of its outcome (``launcher_segment``:
  its exit status and the events its rank 0 wrote); the rule and its invariants live there, shared with the sbatch
  path (slurm/relaunch.py). A preemption (75) or a summary ends the loop before the rule is asked.
- A relaunch is preceded by the resume pre-check of ``--resume`` when RUN_DIR holds a resume state (a failing
  one ends the command with the segment's exit status) and recorded by one ``relaunched`` event; ``relaunches``
  in the summary counts the run's ``relaunched`` events over every segment.
- Standard library and the core only: the launch, the failure report and the pre-check are passed in.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.errors import GyreError
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.lifecycle import recovery, resume
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT, RELAUNCHED as EVENT


def events_of(path: Path) -> list[dict]:
    from gyre_hpc.allocator.eventlog import read_events

    try:
        return read_events(path) if path.is_file() else []
    except GyreError:
        return []


def segment(run_dir: Path, events_path: Path, code: int, before: int, preempted: bool) -> recovery.LaunchSegment:
    """The outcome of the segment that wrote the events after the first ``before`` ones and ended with ``code``."""
    return recovery.launcher_segment(code, events_of(events_path)[before:], resume.exists(run_dir), preempted)


def record(events_path: Path, attempt: int, after_exit: int, reason: str, clock: Clock | None = None) -> None:
    """Append the ``relaunched`` event through the one event log (its ``t`` continues the run's time line)."""
    from gyre_hpc.allocator.eventlog import EventLog

    t = max((float(e.get("t", 0.0)) for e in events_of(events_path)), default=0.0)
    log = EventLog(events_path, clock or WallClock())
    try:
        log.write(EVENT, t=t, attempt=attempt, after_exit=after_exit, reason=reason)
    finally:
        log.close()


def supervise(run_dir: Path, events_path: Path, max_relaunches: int, launch_once: Callable[[], int],
              on_failure: Callable[[int, int], int], precheck: Callable[[], object],
              preempted: Callable[[], bool]) -> int:
    """Launch the run until a segment ends with no reason to relaunch; the exit status of the last one.

    ``launch_once()`` runs one segment (its mpirun status); ``on_failure(code, before)`` reports a segment that
    ended without a summary and not preempted (events, one line) and gives the run's exit status;
    ``precheck()`` is the pre-check of ``--resume`` (raises ``GyreError``); ``preempted()``: a preemption signal
    came. A summary, a preemption (75) or a failure not relaunched ends the loop."""
    done = 0
    while True:
        before = len(events_of(events_path))
        code = launch_once()
        if code == PREEMPTED_EXIT or (run_dir / "summary.json").is_file():
            return code
        code = on_failure(code, before)
        decision = recovery.decide(segment(run_dir, events_path, code, before, preempted()), done, max_relaunches)
        if decision.action is not recovery.Action.RELAUNCH:
            return code
        reason = decision.reason
        try:
            if resume.exists(run_dir):  # else a new run torn down while it started (AT_START): it starts anew
                precheck()
        except GyreError as exc:
            print(f"gyre train: not relaunched: {exc}", file=sys.stderr)
            return code
        if preempted():  # it came during the pre-check: the resume state is there, the scheduler wants us gone
            return PREEMPTED_EXIT
        done += 1
        record(events_path, done, code, reason)
        print(f"gyre train: relaunching the run from {resume.resume_dir(run_dir)} ({reason} after exit {code}; "
              f"relaunch {done} of at most {max_relaunches}, run.max_relaunches)", file=sys.stderr, flush=True)


def add_relaunches(summary_path: Path, events_path: Path) -> dict:
    """The summary with ``relaunches`` (the run's ``relaunched`` events), written back to ``summary_path``."""
    summary = json.loads(summary_path.read_text())
    summary["relaunches"] = sum(e["event"] == EVENT for e in events_of(events_path))
    atomic_write_json(summary_path, summary)
    return summary
