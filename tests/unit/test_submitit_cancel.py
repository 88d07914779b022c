"""On submitit's path a SIGTERM is a preemption or srun's teardown (the job still RUNNING), or ``scancel`` (the job
COMPLETING, then CANCELLED): only the last is not requeued (gyre_hpc/lifecycle/recovery.py, ``cancelled``)."""
import pytest

from gyre_hpc.lifecycle.recovery import cancelled


@pytest.mark.parametrize("signal_name, state, expected", [
    ("SIGTERM", "COMPLETING", True),   # scancel: the job ends while its processes save
    ("SIGTERM", "CANCELLED", True),
    ("SIGTERM", "RUNNING", False),     # SLURM's preemption (GraceTime) or srun's teardown after a lost rank
    ("SIGTERM", None, False),          # scontrol failed: requeue as before rather than lose the job
    ("SIGUSR1", "COMPLETING", False),  # an explicit preemption signal is never a cancel
    ("SIGUSR2", "COMPLETING", False),  # nor submitit's time-limit signal
    (None, "COMPLETING", False),
])
def test_only_a_sigterm_to_a_job_that_no_longer_runs_is_a_cancel(signal_name, state, expected):
    assert cancelled(signal_name, state) is expected
