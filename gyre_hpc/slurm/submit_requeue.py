"""The submitit task of a SLURM training job, requeued with automatic resume when it is preempted (edge: submitit).

``TrainRank`` is ``submit_tasks.train_rank`` as a ``submitit.helpers.Checkpointable``::

    the step gets SIGUSR1 or SIGTERM (a preemption: ``scancel --signal=USR1 JOBID``, srun's signal)
      every rank: the live run stops in order, rank 0 writes RUN_DIR/resume, every rank returns exit 75
      rank 0 (after its role ended, the state on disk): ``checkpoint()`` -> DelayedSubmission(self, config, run_dir)
              stored as submitit's own handler stores it (``job_environment._checkpoint``), then
              ``scontrol requeue`` (``JobEnvironment._requeue``), then SystemExit: submitit writes no result
      the other ranks return None (a requeued job's result files are written anew)
    SLURM runs the same job id again: every rank starts on RUN_DIR, which holds the resume state, and resumes;
    rank 0 returns the summary of all segments (``segments`` counts them) when the run finishes.

Why not from submitit's signal handler: it runs in the main thread, which is the allocator loop's; it cannot wait
there for the resume state, and its ``sys.exit`` would end rank 0 mid-step. submitit's USR2 (``--signal=USR2@N``
before the time limit) is not a preemption here: a rank's USR2 dumps its stacks (jobs/train.py), and a job
that reaches its time limit is not requeued (docs/reliability.md).

Invariants (tests/integration/test_submitit_requeue.py, marker slurm)
- A preempted submitit job is requeued under the same job id and its run finishes with every step, in two
  segments, with ``run.result()`` returning the summary.
- ``checkpoint`` returns a resubmission of the same callable with the same config and RUN_DIR.
"""
from __future__ import annotations

from typing import Any

from submitit.helpers import Checkpointable

from gyre_hpc.errors import GyreError
from gyre_hpc.resume import PREEMPTED_EXIT
from gyre_hpc.slurm.submit_tasks import PREEMPTED, train_rank


def _requeue_preempted(callable_, config: str, run_dir: str) -> None:
    """Rank 0 after a preemption with its resume state saved: what submitit's own signal handler does for a
    ``Checkpointable`` (store ``checkpoint()``'s resubmission, ``scontrol requeue``), done once the state is on
    disk rather than inside the handler (the handler would run in the allocator loop's thread, mid-step)."""
    import submitit
    from submitit.core import job_environment, utils

    env = submitit.JobEnvironment()
    delayed = utils.DelayedSubmission.load(env.paths.submitted_pickle)
    countdown = delayed._timeout_countdown  # a preemption, not a timeout: the timeout budget is kept
    delayed.function = callable_
    why = job_environment._checkpoint(delayed, env.paths.submitted_pickle, countdown)
    if why:
        raise GyreError(f"preempted, resume state in {run_dir}/resume, but not requeued: {why}")
    env._requeue(countdown)
    raise SystemExit(PREEMPTED_EXIT)  # not an Exception: submitit writes no result, the requeued job will


class TrainRank(Checkpointable):
    """The SLURM task of a submitit training job (one rank), requeued with automatic resume when preempted."""

    def __call__(self, config: str, run_dir: str) -> dict[str, Any] | None:
        import submitit

        out = train_rank(config, run_dir, allow_preempted=True)
        if out is PREEMPTED and submitit.JobEnvironment().global_rank == 0:
            _requeue_preempted(self, config, run_dir)
        return None if out is PREEMPTED else out

    def checkpoint(self, config: str, run_dir: str):
        """The same rank function on the same RUN_DIR: a rank started on a RUN_DIR with a resume state resumes."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, config, run_dir)
