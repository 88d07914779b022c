"""The sbatch path's supervisor: after a step that lost a rank, srun the run again inside the same allocation.

Under srun there is no ``gyre train`` launcher around the ranks (every rank runs its role directly), so the batch
script is the launcher, and it asks this module, with the same rule as ``gyre train`` (``lifecycle.recovery``)::

    sbatch script (gyre_hpc.slurm.sbatch)
      loop:  touch RUN_DIR/.step-start; srun ... gyre train CONFIG --run-dir RUN_DIR; RC
             python -m gyre_hpc.slurm.relaunch --run-dir RUN_DIR --exit RC --done N --max M --preempt-signal SIG
               exit 0: relaunched (event ``relaunched``): srun again, the ranks resume from RUN_DIR/resume
               exit 1: not: the script goes on (requeue on a preemption, else it exits RC)
               exit 69: not: a rank was lost while the step started and the relaunches are spent (or 0): event
                        ``rank_lost`` (``at_start``), and the script exits 69, never requeued as a preemption

How a lost rank looks from here: srun's ``--kill-on-bad-exit`` ends the step with SIGTERM to the other ranks.
The script exports ``GYRE_SBATCH_LAUNCHED`` and its traps write RUN_DIR/preempt.request before they forward a
signal, so rank 0 tells the teardown from a preemption as under ``gyre train`` (``live.lost.SrunTeardown``): it
saves the resume state, logs ``lost_rank_saved`` (no ``preempted``) and exits 69; srun reports a non-zero status
(137, the SIGKILLed rank's, on the local cluster; rank 0's 69 shows in .err), which this rule does not read.

Invariants (tests/unit/test_slurm_relaunch.py)
- A step is a lost rank only if it ended non-zero and logged ``lost_rank_saved`` (rank 0 saved at srun's teardown)
  or a ``resume_saved`` newer than the state it resumed from (rank 0's periodic state, live/periodic.py: rank 0
  itself died), and no ``preempted`` event (events with ``wall`` at or after RUN_DIR/.step-start's mtime), the run
  has no summary.json (it finished, whatever its status), and the batch shell was not signalled (the script never
  calls this then): only then ``lifecycle.recovery.decide`` is asked, as for exit 69 with the state saved,
  within ``--max``.
- A step is also a lost rank when it was torn down while it started: it ended with a signal's status (>= 128: a
  rank of it was killed; srun reports the highest), its rank 0 never reached its main loop (no event of
  ``lifecycle.recovery.STARTED`` in the step: rank 0, still importing or in MPI_Init, is SIGKILLed KillWait after
  srun's SIGTERM and saves nothing), no rank wrote RUN_DIR/errors/rankN.txt during it (a rank that raised is an
  error, never relaunched before a first step), no ``preempted`` event, no summary, the shell not signalled. The
  rule relaunches it (``rank_lost_at_start``) from what the step started from; after ``--max`` relaunches it is a
  failure: event ``rank_lost`` (``at_start``: true) and exit 69 (``AT_START_FAILED``).
- A relaunch appends one ``relaunched`` event (``after_exit``: srun's status); this module starts nothing.
- Ranks srun started without the batch script (by hand, or a script rendered before it exported
  ``GYRE_SBATCH_LAUNCHED``) take the teardown's SIGTERM for a preemption: their step logs ``preempted SIGTERM``,
  never ``lost_rank_saved``, so it is never relaunched here; the resume state it saved is requeued by the script
  (or continued by hand with ``gyre train CONFIG --resume RUN_DIR``), as for a preemption.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from gyre_hpc.lifecycle import recovery, resume
from gyre_hpc.lifecycle.recovery import RANK_LOST_EXIT, STEP_START
from gyre_hpc.live import supervise

#: this module's exit status for a step lost while it started that is not relaunched: the job's own (69)
AT_START_FAILED = RANK_LOST_EXIT


def step_outcome(run_dir: Path, events_path: Path, code: int) -> recovery.LaunchSegment:
    """How the step that started at RUN_DIR/.step-start ended, in the recovery rule's terms
    (``recovery.step_segment``): rank 0's own events of the step, a rank's error file of the step, the summary."""
    start = (run_dir / STEP_START).stat().st_mtime if (run_dir / STEP_START).is_file() else 0.0
    events = [e for e in supervise.events_of(events_path) if float(e.get("wall", 0.0)) >= start]
    return recovery.step_segment(code, events, errors=bool(errors_since(run_dir, start)),
                                 finished=(run_dir / "summary.json").is_file(), resume_state=resume.exists(run_dir))


def errors_since(run_dir: Path, start: float) -> list[Path]:
    """RUN_DIR/errors/rankN.txt written at or after ``start`` (a rank that raised: ``live.rank``)."""
    d = run_dir / "errors"
    return [f for f in sorted(d.glob("rank*.txt")) if f.stat().st_mtime >= start] if d.is_dir() else []


def record_failure(events_path: Path, code: int, done: int, resume_dir: Path | None) -> None:
    """The step lost a rank while it started and is not relaunched: one ``rank_lost`` event (as ``gyre train``
    writes after mpirun), continuing the run's time line."""
    from gyre_hpc.allocator.eventlog import EventLog
    from gyre_hpc.clock import WallClock

    t = max((float(e.get("t", 0.0)) for e in supervise.events_of(events_path)), default=0.0)
    log = EventLog(events_path, WallClock())
    try:
        log.write("rank_lost", t=t, at_start=True, srun_exit=code, relaunches=done,
                  error=f"a rank of the step ended by a signal while rank 0 was starting (srun exit {code})",
                  resume=str(resume_dir) if resume_dir else None)
    finally:
        log.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gyre_hpc.slurm.relaunch", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--exit", type=int, required=True, help="srun's exit status")
    p.add_argument("--done", type=int, required=True, help="relaunches this job already made")
    p.add_argument("--max", type=int, required=True, help="run.max_relaunches")
    p.add_argument("--preempt-signal", help="ignored: passed by scripts rendered before the ranks logged "
                   "lost_rank_saved under srun (a requeued job runs the script it was submitted with)")
    p.add_argument("--events", default="events.jsonl", help="allocator.events_file")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    events_path = run_dir / args.events
    decision = recovery.decide(step_outcome(run_dir, events_path, args.exit), args.done, args.max)
    if decision.lost_at_start:
        state = resume.resume_dir(run_dir) if resume.exists(run_dir) else None
        record_failure(events_path, args.exit, args.done, state)
        print(f"gyre: a rank of the step was lost while it started (srun exit {args.exit}); not relaunched after "
              f"{args.done} relaunch(es) (run.max_relaunches {args.max}): the job fails with {AT_START_FAILED}"
              + (f"; its resume state {state} is untouched" if state else ""), file=sys.stderr)
        return AT_START_FAILED
    if decision.action is not recovery.Action.RELAUNCH:
        return 1
    supervise.record(events_path, args.done + 1, args.exit, decision.reason)
    what = "while it started; nothing was applied" if decision.reason == recovery.AT_START else "resume state saved"
    print(f"gyre: a rank of the step was lost (srun exit {args.exit}, {what}); relaunching in this "
          f"allocation ({args.done + 1} of at most {args.max}, run.max_relaunches)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
