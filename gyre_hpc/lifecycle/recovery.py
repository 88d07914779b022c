"""Recovery of a live run as one state machine (core: standard library only): how a run stops, the exit status of
each outcome, and whether it is relaunched, requeued or fails, for every launcher.

::

    rank 0's loop ──stop reason (StopReason: kind + detail, text on the wire "kind: detail")──┐
      DONE        steps done (or the allocator's own stop)                           ─▶ FINISHED    exit 0
      DATA_LOSS   more groups lost than allocator.max_lost_group_share (summary "error") ─▶ FINISHED, failed
      PREEMPTED   a preemption signal or RUN_DIR/preempt.request; resume state saved ─▶ PREEMPTED   exit 75
      RANK_LOST   mpirun's / srun's teardown after a rank died; resume state saved   ─▶ RANK_LOST   exit 69
      ERROR       a rank raised (RUN_DIR/errors/rankN.txt, event ``error``)          ─▶ ERROR       exit 70
      (before any rank starts: a config or usage error                                ─▶ CONFIG_ERROR exit 2)

    the launcher, after a segment (LaunchSegment: its exit status and rank 0's events), asks ``decide``:
      PREEMPTED                           ─▶ REQUEUE  gyre train: exit 75 and how to resume; the sbatch script:
                                                      scontrol requeue; submitit: ``requeue`` (countdown, scancel)
      RANK_LOST / ERROR + a resume state  ─▶ RELAUNCH from RUN_DIR/resume, at most run.max_relaunches times
        (``relaunch_reason``)                         (gyre train: live/supervise.py; sbatch: slurm/relaunch.py)
      anything else                       ─▶ FAIL     the segment's status stands

Preemption requests: how a launcher tells the ranks of a run that it is preempted (``REQUEST_FILE``)::

    launcher gets the preemption signal          writes RUN_DIR/preempt.request (the signal's name, e.g. "SIGUSR1")
      gyre train (live/launch.py)                  and signals no rank (mpirun's SIGTERM to a rank: a rank was lost)
      the sbatch script (slurm/sbatch.py)          then forwards the signal to the step (srun); it exports SBATCH_ENV
                                                   so that rank 0 knows a SIGTERM without the file is srun's
                                                   teardown after a lost rank (live/lost.py, SrunTeardown)
    rank 0 polls the file (live/preempt.py, Preemption.watch/poll) and, once served, removes it

The exit statuses (``EXIT``) are defined here and nowhere else: the sbatch script formats them in, the ranks and
the launchers return them (tests/unit/test_exit_codes.py scans gyre_hpc/ and jobs/ for the literals).

Invariants (tests/unit/test_recovery.py, tests/unit/test_supervise.py, tests/unit/test_slurm_relaunch.py)
- Every ``JobOutcome`` kind has one exit status and no two share one; ``outcome_of`` inverts the table.
- ``StopReason.parse(str(r)) == r`` for every kind: the text that crosses a process (Shutdown, events, the
  summary's ``stop``) is the one ``str`` of a stop reason, and it is classified in this one place.
- ``relaunch_reason`` is a pure function of a segment's outcome: a reason only after exit 69 (``rank_lost``) or 70
  (``error``) when there is a resume state to continue from, saved by this segment (event ``lost_rank_saved`` at the
  end, or ``resume_saved`` on the way: rank 0 may be the rank that died) or the one this segment started from when
  its rank 0 never got to resume (no ``resumed`` event), and only while fewer than ``run.max_relaunches``
  relaunches were made. A ``resume_saved`` counts only if it is newer than the state the segment started from.
- A lost rank (69) while the segment was starting (no event of ``STARTED``) is relaunched (``rank_lost_at_start``)
  with or without a resume state; an error (70) only when its segment trained a step (a ``step`` event).
- Never after a preemption (exit 75, or a preemption signal the launcher received), a config or usage error
  (exit 2), a success or any other status.
- A step under srun (``step_segment``) is a lost rank only if it ended non-zero with ``lost_rank_saved``, a newer
  ``resume_saved`` or a signal's status (>= 128) before rank 0 started and without a rank's error file, with no
  ``preempted`` event and no summary.
- The request file is written whole before the signal is forwarded (a temporary file, then a rename): a rank that
  sees it reads the signal's name, never an empty file; a launcher removes a request an earlier segment left
  before it starts the ranks, unless the request is its own (tests/unit/test_srun_teardown.py).
- ``requeue_countdown``: only the time-limit signal spends one of submitit's timeouts; none left, or a SIGTERM to a job no
  longer RUNNING (``scancel``), is a failure, never a requeue.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from gyre_hpc.lifecycle.rank_signals import RankSignals


class OutcomeKind(enum.Enum):
    FINISHED = "finished"
    PREEMPTED = "preempted"
    RANK_LOST = "rank_lost"
    ERROR = "error"
    CONFIG_ERROR = "config_error"


#: THE exit-code table: the status of every rank and launcher for each outcome (sysexits.h where one fits:
#: 75 EX_TEMPFAIL "try again later", 69 EX_UNAVAILABLE, 70 EX_SOFTWARE; 2 argparse's usage error)
EXIT: Mapping[OutcomeKind, int] = MappingProxyType({
    OutcomeKind.FINISHED: 0, OutcomeKind.PREEMPTED: 75, OutcomeKind.RANK_LOST: 69, OutcomeKind.ERROR: 70,
    OutcomeKind.CONFIG_ERROR: 2})
PREEMPTED_EXIT = EXIT[OutcomeKind.PREEMPTED]
RANK_LOST_EXIT = EXIT[OutcomeKind.RANK_LOST]
ERROR_EXIT = EXIT[OutcomeKind.ERROR]
CONFIG_ERROR_EXIT = EXIT[OutcomeKind.CONFIG_ERROR]
#: a service (engine, proxy) whose parent died ends itself with the error status (gyre_hpc.net.serving)
ORPHAN_EXIT = ERROR_EXIT


def outcome_of(status: int) -> OutcomeKind | None:
    """The outcome an exit status stands for (None: a status of no outcome, e.g. a signal's 137)."""
    return next((k for k, v in EXIT.items() if v == status), None)


#: the file a launcher writes into RUN_DIR when it is preempted (its content: the signal's name)
REQUEST_FILE = "preempt.request"
#: set (to "1") by the sbatch script for the ranks of its steps: their launcher writes REQUEST_FILE before it
#: forwards a preemption signal, so rank 0 can tell srun's teardown SIGTERM from a preemption
SBATCH_ENV = "GYRE_SBATCH_LAUNCHED"
#: the sbatch script touches RUN_DIR/STEP_START before each srun: the events of a step are those after it
STEP_START = ".step-start"

# rank 0's events the rules read
LOST_RANK_SAVED, RESUME_SAVED, RESUMED, PREEMPTED_EVENT = "lost_rank_saved", "resume_saved", "resumed", "preempted"
#: the event a relaunch appends (``after_exit``, ``reason``)
RELAUNCHED = "relaunched"


class StopKind(enum.Enum):
    DONE = "done"  # the allocator's own stop: the steps are done (or the core cell is lost, or interrupted)
    PREEMPTED = "preempted"
    RANK_LOST = "rank_lost"
    DATA_LOSS = "data_loss"
    ERROR = "error"


#: how each kind reads on the wire ("prefix: detail"); DONE is its detail alone
_PREFIX = {StopKind.PREEMPTED: "preempted", StopKind.RANK_LOST: "rank_lost", StopKind.DATA_LOSS: "error",
           StopKind.ERROR: "error"}
#: a DATA_LOSS detail starts with it (gyre_hpc.live.dataloss writes it)
DATA_LOSS = "data loss"


@dataclass(frozen=True)
class StopReason:
    """Why rank 0's loop stopped: a kind and its detail (the signal, who tore the job down, the error)."""

    kind: StopKind
    detail: str

    def __str__(self) -> str:
        prefix = _PREFIX.get(self.kind)
        return self.detail if prefix is None else f"{prefix}: {self.detail}"

    @classmethod
    def parse(cls, text: str) -> "StopReason":
        """The stop reason whose ``str`` is ``text`` (a Shutdown's reason, an event's, an allocator's own)."""
        head, sep, rest = text.partition(": ")
        if head == "preempted":
            return cls(StopKind.PREEMPTED, rest)
        if head == "rank_lost":
            return cls(StopKind.RANK_LOST, rest)
        if head == "error" and sep:
            return cls(StopKind.DATA_LOSS if rest.startswith(DATA_LOSS) else StopKind.ERROR, rest)
        return cls(StopKind.DONE, text)

    @property
    def saves_resume(self) -> bool:
        """Rank 0 writes RUN_DIR/resume for it and the run writes no summary."""
        return self.kind in (StopKind.PREEMPTED, StopKind.RANK_LOST)


@dataclass(frozen=True)
class JobOutcome:
    """How a live run (rank 0's ``run_root``) ended; ``exit`` is the status from the table."""

    kind: OutcomeKind
    reason: StopReason | None = None
    steps_done: int = 0
    run_dir: str = ""
    resume: str | None = None  # RUN_DIR/resume, when rank 0 saved it (preempted, rank lost)
    error: str | None = None  # why the resume state could not be saved
    summary: Mapping[str, Any] | None = None  # FINISHED: the run's summary (summary.json)

    @property
    def exit(self) -> int:
        return EXIT[self.kind]

    @property
    def failed(self) -> bool:
        """Finished in order, but its summary holds an error (data loss): the step fails."""
        return bool(self.summary and self.summary.get("error"))


# ------------------------------------------------------------------ relaunch, requeue or fail
#: the exit statuses after which a run may be relaunched, and the reason each is recorded with
RELAUNCH_REASONS = MappingProxyType({RANK_LOST_EXIT: "rank_lost", ERROR_EXIT: "error"})
#: the reason of a relaunch after a rank lost while the segment started (nothing applied, nothing saved)
AT_START = "rank_lost_at_start"
#: rank 0's events that show it reached its main loop (``resumed`` comes just before it)
STARTED = ("start", "started", RESUMED)
#: srun's status when a task of the step ended by a signal (128 + the signal: 137 SIGKILL, 143 SIGTERM)
SIGNALLED_STATUS = 128


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


class Action(enum.Enum):
    RELAUNCH = "relaunch"  # launch the run again from RUN_DIR (same command, same allocation)
    REQUEUE = "requeue"  # preempted, resume state saved: the scheduler (or the user) runs the job again
    FAIL = "fail"  # the segment's status stands


@dataclass(frozen=True)
class RecoveryDecision:
    action: Action
    exit: int  # the status the launcher ends with unless it relaunches
    reason: str | None = None  # RELAUNCH: the reason recorded in the ``relaunched`` event
    lost_at_start: bool = False  # FAIL: a rank lost while the segment started, no relaunch left (event rank_lost)


def decide(seg: LaunchSegment, done: int, max_relaunches: int) -> RecoveryDecision:
    """What a launcher does after the segment ``seg`` when it made ``done`` relaunches already."""
    reason = relaunch_reason(seg, done, max_relaunches)
    if reason is not None:
        return RecoveryDecision(Action.RELAUNCH, seg.exit, reason)
    if seg.exit == PREEMPTED_EXIT:
        return RecoveryDecision(Action.REQUEUE, seg.exit)
    at_start = seg.exit == RANK_LOST_EXIT and seg.at_start and not seg.preempted
    return RecoveryDecision(Action.FAIL, seg.exit, lost_at_start=at_start)


def started(kinds: Iterable[str]) -> bool:
    """A segment's event kinds show its rank 0 reached its main loop (``STARTED``)."""
    return any(k in STARTED for k in kinds)


def saved_newer(events: list[dict]) -> bool:
    """A segment's events (in order) hold a ``resume_saved`` newer than the state it resumed from (none: 0 steps)."""
    start = next((int(e.get("steps_done", 0)) for e in events if e["event"] == RESUMED), 0)
    return any(e["event"] == RESUME_SAVED and int(e.get("steps_done", 0)) > start for e in events)


def launcher_segment(code: int, events: list[dict], resume_state: bool, preempted: bool) -> LaunchSegment:
    """The segment ``gyre train``'s launcher saw end with ``code`` (``events``: those it wrote)."""
    kinds = [e["event"] for e in events]
    return LaunchSegment(exit=code, saved=LOST_RANK_SAVED in kinds, resume_state=resume_state, resumed=RESUMED in kinds,
                   preempted=preempted, stepped="step" in kinds, checkpointed=saved_newer(events),
                   started=started(kinds))


def step_segment(code: int, events: list[dict], errors: bool, finished: bool, resume_state: bool) -> LaunchSegment:
    """The srun step that ended with ``code``, in the launcher's terms (``events``: rank 0's of the step;
    ``errors``: a rank wrote RUN_DIR/errors/rankN.txt during it; ``finished``: the run has its summary)."""
    kinds = {e["event"] for e in events}
    saved, preempted, begun = LOST_RANK_SAVED in kinds, PREEMPTED_EVENT in kinds, started(kinds)
    newer = saved_newer(events)  # rank 0's periodic state: rank 0 itself may be the rank that died
    at_start = code >= SIGNALLED_STATUS and not begun and not errors
    lost = code != 0 and (saved or newer or at_start) and not preempted and not finished
    return LaunchSegment(exit=RANK_LOST_EXIT if lost else code, saved=saved, resume_state=resume_state,
                   resumed=RESUMED in kinds, preempted=preempted, checkpointed=newer, started=begun)


def requeue_countdown(countdown: int, signal_name: str | None, signals: RankSignals) -> int:
    """The timeouts left after this requeue, as submitit's ``checkpoint_and_try_requeue`` counts them: the
    time-limit signal spends one, a preemption none; below 0 the job is not requeued."""
    return countdown - int(signals.is_time_limit(signal_name))


def cancelled(signal_name: str | None, job_state: str | None) -> bool:
    """The preemption was ``scancel``: a SIGTERM while the job is no longer RUNNING (``job_state`` as ``scontrol
    show job`` gives it: COMPLETING or CANCELLED after scancel; None: unknown, taken as running)."""
    return signal_name == "SIGTERM" and job_state is not None and job_state != "RUNNING"
