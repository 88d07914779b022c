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
- ``relaunch_reason`` is a pure function of a segment's outcome: a reason only after exit 69 (``rank_lost``) or 70
  (``error``: a cell's rank raised and mpirun tore the job down) when there is a resume state to continue from,
  saved by this segment (event ``lost_rank_saved`` at the end, or ``resume_saved`` on the way: rank 0 may be the
  rank that died) or the one this segment started from when its rank 0 never got to resume (no ``resumed``
  event), and only while fewer than ``run.max_relaunches`` relaunches were made.
- A ``resume_saved`` counts only if it is newer than the state the segment started from (its ``steps_done`` above
  the ``resumed`` event's): a segment that resumed and died before it saved again is not relaunched, so a run
  whose rank 0 dies at the same step every time stops after one relaunch, never loops.
- A lost rank (69) while the segment was starting, before its rank 0 reached its main loop (no ``start``,
  ``started`` or ``resumed`` event: ``STARTED``), is relaunched (reason ``rank_lost_at_start``) with or without a
  resume state: nothing was applied in that segment, so the run dir holds exactly what the segment started from
  (no state: a new run starts again; the resume state it was to resume, untouched). Rank 0 need not have saved
  anything (under srun it is SIGKILLed KillWait after the teardown while it still imports or sits in MPI_Init);
  the bound is ``run.max_relaunches``, after which the segment's failure stands (69, event ``rank_lost``).
- An error (70) is relaunched only when its segment trained a step (a ``step`` event): an error before the
  segment's first step is a start that fails (an engine that cannot load its model, a broken install), and a
  relaunch from the same state would fail the same way, costing the user one more start each time. A lost rank
  (69) is relaunched whenever it is (a killed rank is no property of the start).
- Never after a preemption (exit 75, or a SIGTERM/SIGUSR1 the launcher received during the segment: the scheduler
  wants the job gone), a config or usage error (exit 2), a success or any other status; ``max_relaunches: 0``
  is the behaviour before this module (the launcher exits 69 or 70).
- A relaunch is preceded by the resume pre-check of ``--resume`` when RUN_DIR holds a resume state (a failing
  one ends the command with the segment's exit status) and recorded by one ``relaunched`` event; ``relaunches``
  in the summary counts the run's ``relaunched`` events over every segment.
- Standard library and the core only: the launch, the failure report and the pre-check are passed in.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gyre_hpc import resume
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.errors import GyreError
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.live.lost import RANK_LOST_EXIT
from gyre_hpc.live.periodic import EVENT as PERIODIC_EVENT
from gyre_hpc.resume import PREEMPTED_EXIT

#: exit status of a run that ended on an unrecoverable error (EX_SOFTWARE); RANK_LOST_EXIT (69) is live/lost.py's
ERROR_EXIT = 70
#: the exit statuses after which a run may be relaunched, and the reason each is recorded with
RELAUNCH_REASONS = {RANK_LOST_EXIT: "rank_lost", ERROR_EXIT: "error"}
#: the reason of a relaunch after a rank lost while the segment started (nothing applied, nothing saved)
AT_START = "rank_lost_at_start"
#: rank 0's events that show it reached its main loop (``resumed`` comes just before it): from then on it may apply
#: steps, and it takes a teardown itself (live/lost.py); a segment without any of them applied nothing
STARTED = ("start", "started", "resumed")
EVENT = "relaunched"


@dataclass(frozen=True)
class LaunchSegment:
    """How one launch of the run ended, as the supervisor sees it."""

    exit: int  # the launcher's exit status for it (69 rank lost, 70 error, 75 preempted, 0, 2, ...)
    saved: bool  # its rank 0 saved a resume state (event ``lost_rank_saved``)
    resume_state: bool  # RUN_DIR/resume holds a state now
    resumed: bool  # its rank 0 logged ``resumed`` (it started from the earlier state and went on)
    preempted: bool  # the launcher got a preemption signal while it ran
    stepped: bool = True  # it trained a step (a ``step`` event): asked only after an error (exit 70)
    checkpointed: bool = False  # its rank 0 saved a state newer than the segment's start (``resume_saved``)
    started: bool = True  # its rank 0 reached its main loop (an event of ``STARTED``): it may have applied steps

    @property
    def at_start(self) -> bool:
        """Ended before its rank 0 reached its main loop, saving nothing: it applied nothing."""
        return not (self.started or self.saved or self.checkpointed)


def relaunch_reason(seg: LaunchSegment, done: int, max_relaunches: int) -> str | None:
    """Why ``seg`` is relaunched (``rank_lost``, ``error``, ``rank_lost_at_start``), or None: it is not, after
    ``done`` relaunches."""
    if seg.preempted or seg.exit not in RELAUNCH_REASONS or done >= max_relaunches:
        return None
    if seg.exit == ERROR_EXIT and not seg.stepped:  # it failed while starting: a relaunch starts the same way
        return None
    if seg.exit == RANK_LOST_EXIT and seg.at_start:  # torn down while starting: nothing applied, start it again
        return AT_START
    if seg.saved or (seg.checkpointed and seg.resume_state) or (seg.resume_state and not seg.resumed):
        return RELAUNCH_REASONS[seg.exit]
    return None


def events_of(path: Path) -> list[dict]:
    from gyre_hpc.allocator.eventlog import read_events

    try:
        return read_events(path) if path.is_file() else []
    except GyreError:
        return []


def segment(run_dir: Path, events_path: Path, code: int, before: int, preempted: bool) -> LaunchSegment:
    """The outcome of the segment that wrote the events after the first ``before`` ones and ended with ``code``."""
    events = events_of(events_path)[before:]
    kinds = [e["event"] for e in events]
    return LaunchSegment(exit=code, saved="lost_rank_saved" in kinds, resume_state=resume.exists(run_dir),
                   resumed="resumed" in kinds, preempted=preempted, stepped="step" in kinds,
                   checkpointed=saved_newer(events), started=started(kinds))


def started(kinds) -> bool:
    """A segment's event kinds show its rank 0 reached its main loop (``STARTED``)."""
    return any(k in STARTED for k in kinds)


def saved_newer(events: list[dict]) -> bool:
    """A segment's events (in order) hold a ``resume_saved`` newer than the state it resumed from (none: 0 steps)."""
    start = next((int(e.get("steps_done", 0)) for e in events if e["event"] == "resumed"), 0)
    return any(e["event"] == PERIODIC_EVENT and int(e.get("steps_done", 0)) > start for e in events)


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
        reason = relaunch_reason(segment(run_dir, events_path, code, before, preempted()), done, max_relaunches)
        if reason is None:
            return code
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
