"""Rank 0's allocator loop in a live run (edge): ``LiveServer`` = ``AllocatorServer`` (messages → SchedState → the
policy's orders) + the hub's data plane (``Hub.poll``) in the same thread, the only thread that touches MPI.
``live.root.RootRun`` builds it in its ``wire`` phase and drives it in ``run``.

Invariants (tests/integration/test_live_training.py, tests/unit/test_root_run.py)
- Why the loop stops is typed (``lifecycle.recovery.StopReason``): a lost rank first, then the base loop's reasons,
  data loss, a preemption once no step is pending (or overdue).
- A step the hub takes reaches the allocator's state in the same pass (``apply_step``), and the policy decides in
  that pass: the allocator's version always equals the hub's.
- Once a rank is lost, the shutdown sends nothing and waits for no Bye (mpirun is ending every rank).
"""
from __future__ import annotations

from gyre_hpc.allocator.messages import TrainProgress
from gyre_hpc.allocator.server import AllocatorServer
from gyre_hpc.lifecycle.recovery import StopKind, StopReason
from gyre_hpc.live import dataloss, lost, preempt
from gyre_hpc.live.hub import Hub

PROGRESS_EVERY_S = 5.0


class LiveServer(AllocatorServer):
    """The allocator loop plus the hub's data plane in the same thread (the only thread that touches MPI)."""

    def __init__(self, *args, hub: Hub, before_shutdown=lambda reason: None, progress=lambda: None,
                 preemption: preempt.Preemption | None = None, teardown: lost.Teardown | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hub, self.before_shutdown, self.progress = hub, before_shutdown, progress
        self.preemption = preemption or preempt.Preemption()
        self.teardown = teardown or lost.Teardown()
        self.last_progress = 0.0
        self.lost_groups: dataloss.LostGroups | None = None
        self.step_applied = False

    def stop_reason(self) -> str | None:
        """The allocator loop's stop reason as text (the base class writes it to events and Shutdown orders)."""
        stop = self.stop()
        return None if stop is None else str(stop)

    def stop(self) -> StopReason | None:
        """Why the loop stops now (typed), or None."""
        if self.teardown.requested:  # a rank is gone: nothing else matters now
            return self.teardown.reason()
        reason = super().stop_reason()
        if reason is None and self.lost_groups is not None and self.lost_groups.error is not None:
            return StopReason(StopKind.DATA_LOSS, self.lost_groups.error)
        if reason is not None:
            return StopReason(StopKind.DONE, reason)
        self.preemption.poll()  # the launcher's request file (lifecycle.recovery.REQUEST_FILE)
        if not self.preemption.requested:
            return None
        self.hub.freeze()  # the core can finish the step already out, and no other
        quiet = self.started and not self.hub.step_pending
        return StopReason(StopKind.PREEMPTED, self.preemption.signal) if quiet or self.preemption.overdue else None

    def _decide(self, now: float) -> None:
        if not self.preemption.requested:
            super()._decide(now)

    def step(self) -> bool:
        changed = super().step()
        if self.lost_groups is not None:
            self.lost_groups.poll(self.log.write)
        if self.clock.now() - self.last_progress > PROGRESS_EVERY_S:
            self.last_progress = self.clock.now()
            self.progress()
        busy = self.hub.poll()
        if self.step_applied:  # a step changes what the policy sees: decide in the pass that applied it
            self.step_applied = False
            if self.started and self.stop_reason() is None:
                self._decide(self.clock.now())
        return busy or changed

    def apply_step(self, rec: dict, progress: dict) -> None:
        """The core's STEPPED, which the hub just took, is the one report of an optimizer step: it reaches the
        allocator's state (as the core's ``TrainProgress`` to version ``rec["version"]``, with the groups it
        processed since its last report) before the hub answers another WANT, so both see the same version."""
        msg = TrainProgress(cell=self.state.core, version=rec["version"], groups=progress.get("groups", 0),
                            work_s=progress.get("work_s", 0.0), mean_lag=max(0.0, rec.get("staleness_mean", 0.0)),
                            lag_tokens=float(rec.get("lag_tokens", 0)))
        self.step_applied |= self._apply(msg, self.clock.now(), None)

    def abandon_shutdown(self) -> bool:
        return self.teardown.requested  # mpirun is ending every rank: no Bye will come

    def shutdown(self, reason: str) -> dict:
        self.before_shutdown(StopReason.parse(reason))
        if StopReason.parse(reason).kind is not StopKind.RANK_LOST:
            return super().shutdown(reason)
        # the job is being torn down: no message to ranks that may be gone, no Byes to wait for
        summary = {"reason": reason, "steps_done": self.state.steps_done, "version": self.state.version,
                   "lost": self.ex.lost, "no_bye": []}
        self.log.write({"event": "stop", **summary})
        self.log.close()
        self.closed = True
        return summary
