"""The sbatch path's supervisor: after a step that lost a rank, srun the run again inside the same allocation.

Under srun there is no ``gyre train`` launcher around the ranks (every rank runs its role directly), so the batch
script is the launcher, and it asks this module, with the same rule as ``gyre train`` (``live.supervise``)::

    sbatch script (gyre_hpc.slurm.sbatch)
      loop:  touch RUN_DIR/.step-start; srun ... gyre train CONFIG --run-dir RUN_DIR; RC
             python -m gyre_hpc.slurm.relaunch --run-dir RUN_DIR --exit RC --done N --max M --preempt-signal SIG
               exit 0: relaunched (event ``relaunched``): srun again, the ranks resume from RUN_DIR/resume
               exit 1: not: the script goes on (requeue on a preemption, else it exits RC)

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
  calls this then): only then ``live.supervise.relaunch_reason`` is asked, as for exit 69 with the state saved,
  within ``--max``.
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

from gyre_hpc import resume
from gyre_hpc.live import supervise
from gyre_hpc.live.lost import RANK_LOST_EXIT

STEP_START = ".step-start"


def step_outcome(run_dir: Path, events_path: Path, code: int) -> supervise.Segment:
    """How the step that started at RUN_DIR/.step-start ended, in ``live.supervise``'s terms: rank 0's own
    events of the step say whether it lost a rank (``lost_rank_saved``) or was preempted (``preempted``)."""
    start = (run_dir / STEP_START).stat().st_mtime if (run_dir / STEP_START).is_file() else 0.0
    events = [e for e in supervise.events_of(events_path) if float(e.get("wall", 0.0)) >= start]
    kinds = {e["event"] for e in events}
    saved, preempted = "lost_rank_saved" in kinds, "preempted" in kinds
    newer = supervise.saved_newer(events)  # rank 0's periodic state: rank 0 itself may be the rank that died
    lost = code != 0 and (saved or newer) and not preempted and not (run_dir / "summary.json").is_file()
    return supervise.Segment(exit=RANK_LOST_EXIT if lost else code, saved=saved, resume_state=resume.exists(run_dir),
                             resumed="resumed" in kinds, preempted=preempted, checkpointed=newer)


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
    seg = step_outcome(run_dir, events_path, args.exit)
    reason = supervise.relaunch_reason(seg, args.done, args.max)
    if reason is None:
        return 1
    supervise.record(events_path, args.done + 1, args.exit, reason)
    print(f"gyre: a rank of the step was lost (srun exit {args.exit}, resume state saved); relaunching in this "
          f"allocation ({args.done + 1} of at most {args.max}, run.max_relaunches)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
