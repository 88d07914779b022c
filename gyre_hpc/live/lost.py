"""A rank lost under ``gyre train`` or the sbatch script (edge: signals, files): rank 0 saves what it has, then the
job fails with 69.

::

    a cell's rank dies (SIGKILL, OOM killer, a crash)
      mpirun sees it and tears the job down: SIGTERM to every other rank, SIGKILL ``KILL_AFTER_S`` later
      (``gyre train`` sets Open MPI's ``odls_base_sigkill_timeout`` to it)
      or srun (the sbatch path) does: ``--kill-on-bad-exit`` SIGTERMs the other ranks, SIGKILL after SLURM's KillWait
    rank 0 (``Teardown`` installed: under ``gyre train`` a signal on a rank is never a preemption, which comes
    as RUN_DIR/preempt.request; ``SrunTeardown`` under the sbatch script, whose traps write that file before they
    forward the signal: a SIGTERM is the teardown unless a preemption was requested already (SIGUSR1, the file)
    or the file appears within ``REQUEST_GRACE_S`` of it: SLURM signals the batch shell and the step at about the
    same time when it cancels or preempts the job)
      the allocator loop stops at its next pass (reason ``rank_lost: ...``): Rollouts.close, no orderly
      shutdown (no message goes to a rank that may be gone, the runs are not cut: the proxy and the harness
      end with rank 0), RUN_DIR/resume written first from what rank 0 holds (this segment's proxy counters
      are not in it):
        - the buffer: the groups out for the unfinished step, then the ready ones, each with its ready_version
        - the queries in flight (re-issued by ``--resume`` as after a preemption)
        - the core's checkpoint of the last step rank 0 applied: ``hold`` keeps hard links of it in
          RUN_DIR/checkpoints/applied at every STEPPED (the core may have saved a newer one whose STEPPED
          never arrived; that step is trained again after the resume)
        - the staleness counters of those steps (rebuilt from the step records when the allocator's control
          plane had not applied the last one yet)
      event ``lost_rank_saved``; rank 0 exits ``recovery.RANK_LOST_EXIT`` at once (MPI_Finalize would wait for the dead)
    ``gyre train`` appends ``rank_lost`` (with the resume path) and exits 69; ``--resume RUN_DIR`` continues.

    srun reports the step's status: 137, the SIGKILLed rank's (measured on the local cluster; rank 0's 69 is in
    the job's .err as "task 0: Exited with exit code 69"); the sbatch script asks ``gyre_hpc.slurm.relaunch``,
    which relaunches a step with ``lost_rank_saved`` and no ``preempted`` event.

Invariants (tests/integration/test_preempt_edges.py::test_sigkill_of_a_rollout_cells_rank_exits_69_with_a_resume_state_that_finishes,
tests/unit/test_srun_teardown.py,
tests/integration/test_slurm_live.py::test_a_killed_cell_rank_is_srun_again_in_the_allocation_and_the_job_completes)
- The saved state passes ``gyre_hpc.lifecycle.resume.load``: its checkpoint holds its version, the step records and the
  SchedState counters agree.
- No buffered group was trained in that checkpoint (the groups of an unfinished step are buffered again).
- ``SrunTeardown`` decides once: a teardown only after ``REQUEST_GRACE_S`` without a request file and without a
  preemption; a preemption (the file seen, or requested) is never turned into a teardown later, even once the
  served file is removed; a teardown stays one.

Not covered: a rank 0 blocked inside an MPI call to the dead rank (a large group being sent to it) runs no Python
until mpirun's (srun's) SIGKILL: no resume state then (the previous one, if any, stays). Ranks srun started
without the sbatch script (by hand, or submitit's; no ``SBATCH_ENV``) have no launcher that writes the request
file: there a SIGTERM is a preemption, as it must be for SLURM's own preemption of a submitit job (resume state,
exit 75, event ``preempted``), and a lost rank looks like one too.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from gyre_hpc.lifecycle import resume
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.errors import CheckpointError
from gyre_hpc.files.io import atomic_dir
from gyre_hpc.lifecycle.recovery import StopKind, StopReason
from gyre_hpc.live import preempt

#: seconds rank 0 under the sbatch script waits, after a SIGTERM, for the script's RUN_DIR/preempt.request before it
#: takes the SIGTERM for srun's teardown (a lost rank). SLURM's cancel or preemption signals the batch shell and the
#: step at about the same time and the shell's trap writes the file at once (a fork of mv), so a preemption is seen
#: within milliseconds; the grace stays well under SLURM's KillWait (30 s by default, 5 s on the local cluster), which
#: must still leave rank 0 the time to save (milliseconds) before srun's SIGKILL
REQUEST_GRACE_S = 1.0
#: seconds mpirun waits between its SIGTERM and its SIGKILL when it tears a job down (Open MPI's default: 1);
#: rank 0 saves in milliseconds (measured 6 ms after the signal), and mpirun outlives its ranks by about this long
KILL_AFTER_S = 3
HELD = "applied"


class Teardown:
    """The SIGTERM mpirun sends when it ends the job because a rank died; ``on_signal`` runs in the handler."""

    def __init__(self, clock: Clock | None = None):
        self.signal: str | None = None
        self.at: float | None = None  # on ``clock`` (WallClock.now is safe inside a signal handler)
        self.clock = clock or WallClock()

    def install(self) -> "Teardown":
        signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.signal is None:
            self.signal, self.at = signal.Signals(signum).name, self.clock.now()

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def since_s(self) -> float:
        """Seconds since the signal (0 before it came)."""
        return 0.0 if self.at is None else self.clock.now() - self.at

    def reason(self) -> StopReason:
        return StopReason(StopKind.RANK_LOST, f"{self.signal} from mpirun (a rank of the job ended)")


class SrunTeardown(Teardown):
    """Rank 0 under the sbatch script: a SIGTERM is srun's teardown (``--kill-on-bad-exit``: a rank of the step
    ended) unless it is a preemption: ``preemption`` was requested already (SIGUSR1, the request file), or the
    batch script's ``request`` file exists or appears within ``grace_s`` of the signal. Decided once. Either way
    the harness closes at the signal (``preemption.on_signal``: no group starts or joins the buffer), as both
    paths need: srun's SIGTERM reaches every process of the step, the proxy and the engines too."""

    def __init__(self, preemption, request: Path, clock: Clock | None = None, grace_s: float = REQUEST_GRACE_S):
        super().__init__(clock)
        self.preemption, self.request, self.grace_s = preemption, Path(request), grace_s
        self.decided: bool | None = None  # True: srun's teardown; False: a preemption

    def _handler(self, signum, frame) -> None:
        first = self.signal is None
        super()._handler(signum, frame)
        if first:
            self.preemption.on_signal()

    def adopt(self) -> "SrunTeardown":
        """Take over a SIGTERM the preemption noted while the rank started (before this handler was installed) and
        the request file does not explain: it is decided by the same rule, from the moment it came (on this
        teardown's clock)."""
        p = self.preemption
        if p.signal == "SIGTERM" and p.at is not None and not self.request.exists():
            ago = p.clock.now() - p.at
            if self.signal is None or self.since_s() < ago:
                self.signal, self.at = p.signal, self.clock.now() - ago
            p.signal = p.at = None
        return self

    @property
    def requested(self) -> bool:
        if self.signal is not None and self.decided is None:
            if self.preemption.requested or self.request.exists():
                self.decided = False
            elif self.since_s() >= self.grace_s:
                self.decided = True
        return bool(self.decided)

    def reason(self) -> StopReason:
        return StopReason(StopKind.RANK_LOST, f"{self.signal} from srun (a rank of the step ended)")


def held_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / HELD


def hold(run_dir: Path, version: int) -> bool:
    """Keep hard links of checkpoints/latest as checkpoints/applied if it holds ``version`` (the step rank 0
    just applied; the core saves it before it reports the step, and saves no newer one before the next batch)."""
    latest = preempt.checkpoint_dir(run_dir)
    if _version(latest) != version:
        return False
    try:
        with atomic_dir(held_dir(run_dir)) as tmp:
            for f in sorted(latest.iterdir()):
                os.link(f, tmp / f.name)
    except (OSError, CheckpointError):
        return False  # the core replaced it meanwhile: the next step holds again
    return True


def checkpoint_for(run_dir: Path, version: int) -> Path | None:
    """A checkpoint directory of exactly ``version``: the held one, the core's latest, or the resumed one."""
    for d in (held_dir(run_dir), preempt.checkpoint_dir(run_dir), resume.resume_dir(run_dir) / resume.CHECKPOINT):
        if _version(d) == version:
            return d
    return None


def _version(d: Path) -> int | None:
    try:
        return int(json.loads((d / "meta.json").read_text())["version"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def snapshot(server, hub, rollouts, steps: list[dict], carry: dict, wall_s: float) -> dict:
    """The resume state at the moment of the loss (``preempt.snapshot``, consistent even mid-step)."""
    rollouts.close()
    return caught_up(preempt.snapshot(server, hub, rollouts, steps, carry, wall_s), hub.version, steps)


def caught_up(state: dict, version: int, steps: list[dict]) -> dict:
    """``state`` with SchedState counters of the steps the data plane applied (``version``, ``steps``): the
    allocator's control plane may not have applied the last STEPPED yet."""
    if state["sched"]["version"] != version or state["sched"]["steps_done"] != len(steps):
        state["sched"] = sched_from_steps(steps, state["sched"])
    return state


def sched_from_steps(steps: list[dict], sched: dict) -> dict:
    """The SchedState counters the step records imply (``SchedState.record_batch_lag`` adds each step's mean lag,
    and its lag times its ``lag_tokens``)."""
    lags = [(max(0.0, float(s["staleness_mean"])), float(s.get("lag_tokens", 0))) for s in steps]
    return {**sched, "version": len(steps), "steps_done": len(steps), "trained_batches": len(steps),
            "lag_sum": sum(lag for lag, _ in lags), "lag_token_sum": sum(lag * n for lag, n in lags),
            "lag_tokens": sum(n for _, n in lags), "onpolicy_batches": int(bool(lags)),  # step 1: from version 0
            "onpolicy_tokens": lags[0][1] if lags else 0.0}


def save(run_dir: Path, state: dict) -> Path:
    """Write RUN_DIR/resume for ``state``: with the checkpoint of its version, or none at version 0 (the core
    had not published yet: the resumed core starts from the config's seed)."""
    ckpt = checkpoint_for(run_dir, state["version"])
    if ckpt is not None:
        return resume.save(run_dir, state, ckpt)
    if state["version"] != 0:
        raise CheckpointError(f"{run_dir}: no checkpoint of version {state['version']} to resume from")
    with atomic_dir(resume.resume_dir(run_dir)) as tmp:
        (tmp / resume.STATE).write_text(json.dumps({"format": resume.FORMAT, **state}, indent=1, sort_keys=True)
                                        + "\n")
    return resume.resume_dir(run_dir)


def drop_held(run_dir: Path) -> None:
    """The run finished: the held links are not needed any more."""
    shutil.rmtree(held_dir(run_dir), ignore_errors=True)
