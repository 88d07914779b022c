"""The submitit task of a SLURM training job, requeued with automatic resume when it is preempted or reaches its
time limit (edge: submitit).

``TrainRank`` is ``submit_tasks.train_rank`` as a ``submitit.helpers.Checkpointable``::

    the step gets SIGUSR1 or SIGTERM (a preemption: ``scancel --signal=USR1 JOBID``, srun's signal), or the signal
    submitit's sbatch asks for N seconds before the time limit (``--signal=USR2@N``, N = slurm.signal's seconds;
    gyre_hpc.lifecycle.rank_signals: on submitit's tasks USR2 is a preemption, and the stack dump is SIGQUIT)
      every rank: the live run stops in order, rank 0 writes RUN_DIR/resume, every rank returns exit 75
      rank 0 (after its role ended, the state on disk): ``checkpoint()`` -> DelayedSubmission(self, config, run_dir)
              stored as submitit's own handler stores it (``job_environment._checkpoint``), then
              ``scontrol requeue`` (``JobEnvironment._requeue``), then SystemExit: submitit writes no result
      the other ranks return None (a requeued job's result files are written anew)
    SLURM runs the same job id again: every rank starts on RUN_DIR, which holds the resume state, and resumes;
    rank 0 returns the summary of all segments (``segments`` counts them) when the run finishes.

A SIGTERM is a preemption (SLURM's own: the job keeps RUNNING through its GraceTime) or srun's teardown after a
lost rank (the job keeps RUNNING), but also ``scancel JOBID``, which a user means as the end: the job is then
CANCELLED at once (``scontrol`` shows it COMPLETING while its processes end). So after a SIGTERM rank 0 asks the
job's state before it requeues (``lifecycle.recovery.cancelled``): a job no longer RUNNING is not requeued; the resume state stays
and the task fails saying so. (submitit's own handler never takes SIGTERM: it bypasses it.)

The time limit counts as submitit counts it: a requeue after the time-limit signal spends one of the job's
timeouts (the executor's ``max_num_timeout``, 3 by default; ``lifecycle.recovery.requeue_countdown``), a preemption spends none; a
job out of timeouts is not requeued and fails saying where its resume state is (``gyre train --resume``).

Why not from submitit's signal handler: it runs in the main thread, which is the allocator loop's; it cannot wait
there for the resume state, and its ``sys.exit`` would end rank 0 mid-step.

Invariants (tests/integration/test_submitit_requeue.py, marker slurm; tests/unit/test_rank_signals.py)
- A preempted submitit job is requeued under the same job id and its run finishes with every step, in two
  segments, with ``run.result()`` returning the summary; so is one that reaches its time limit (its
  ``preempted`` event names the time-limit signal).
- ``checkpoint`` returns a resubmission of the same callable with the same config and RUN_DIR.
- Only the time-limit signal spends a timeout; with none left the job is not requeued.
- A SIGTERM to a job that is no longer RUNNING (``scancel``) is never requeued (``cancelled``).
"""
from __future__ import annotations

from typing import Any

from submitit.helpers import Checkpointable

from gyre_hpc.errors import GyreError
from gyre_hpc.lifecycle import rank_signals
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT, cancelled, requeue_countdown
from gyre_hpc.slurm.submit_tasks import Preempted, train_rank


def job_state(job_id: str) -> str | None:
    """The job's state as ``scontrol show job`` prints it (RUNNING, COMPLETING, ...); None if scontrol fails."""
    import re
    import subprocess

    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bJobState=(\S+)", out)
    return found.group(1) if found else None


def _requeue_preempted(callable_, config: str, run_dir: str, signal_name: str | None) -> None:
    """Rank 0 after a preemption with its resume state saved: what submitit's own signal handler does for a
    ``Checkpointable`` (store ``checkpoint()``'s resubmission, ``scontrol requeue``), done once the state is on
    disk rather than inside the handler (the handler would run in the allocator loop's thread, mid-step)."""
    import submitit
    from submitit.core import job_environment, utils

    env = submitit.JobEnvironment()
    if cancelled(signal_name, state := job_state(env.job_id)):
        raise GyreError(f"cancelled (SIGTERM with the job {state}: scancel), not requeued; the resume state is in "
                        f"{run_dir}/resume: continue with gyre train CONFIG --resume {run_dir}")
    delayed = utils.DelayedSubmission.load(env.paths.submitted_pickle)
    countdown = requeue_countdown(delayed._timeout_countdown, signal_name, rank_signals.current())
    if countdown < 0:
        raise GyreError(f"reached its time limit ({signal_name}) more times than submitit's max_num_timeout "
                        f"allows: not requeued; the resume state is in {run_dir}/resume: continue with "
                        f"gyre train CONFIG --resume {run_dir}, or submit with a longer slurm.time")
    delayed.function = callable_
    why = job_environment._checkpoint(delayed, env.paths.submitted_pickle, countdown)
    if why:
        raise GyreError(f"preempted, resume state in {run_dir}/resume, but not requeued: {why}")
    env._requeue(countdown)
    raise SystemExit(PREEMPTED_EXIT)  # not an Exception: submitit writes no result, the requeued job will


class TrainRank(Checkpointable):
    """The SLURM task of a submitit training job (one rank), requeued with automatic resume when preempted or at
    its time limit."""

    def __call__(self, config: str, run_dir: str) -> dict[str, Any] | None:
        import submitit

        out = train_rank(config, run_dir, allow_preempted=True)
        if isinstance(out, Preempted) and submitit.JobEnvironment().global_rank == 0:
            _requeue_preempted(self, config, run_dir, out.signal)
        return None if isinstance(out, Preempted) else out

    def checkpoint(self, config: str, run_dir: str):
        """The same rank function on the same RUN_DIR: a rank started on a RUN_DIR with a resume state resumes."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, config, run_dir)
