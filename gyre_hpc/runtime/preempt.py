"""Preemption and resume of a live run (edge: signals, files): the signal handlers and rank 0's resume state.

::

    SIGTERM / SIGUSR1 on a rank     (mpirun forwards SIGUSR1 to the ranks; srun and scancel signal the step)
      rank 0:  Rollouts.close (no group starts or becomes ready) · Hub.freeze (no group goes out) · no more
               decisions · wait until no step is pending and the allocator applied the core's last step
               · write RUN_DIR/resume (gyre_hpc.resume) · event ``preempted`` · Shutdown("preempted: SIG") to the cells
      cells:   note the signal, keep going until rank 0's Shutdown (the core never starts a step it cannot finish:
               it steps only on a whole batch, and none goes out after the freeze)
      every rank exits with PREEMPTED_EXIT; ``gyre train`` prints how to resume, sbatch requeues the job
    resume:  the core loads resume/checkpoint; rank 0 restores the hub's buffer (rebuilt from the TITO files),
             the SchedState counters, the step records and the run counters; event ``resumed``

The buffer is the hub's untrained groups, then (fixed batches) the ready groups still held for an incomplete
batch, by gid. After a resume they are all ready at once and fixed batches count on from the next group
admitted: the one batch boundary a resume moves.

Once its role has ended (run_root returned, the cell said Bye) a rank ignores both signals until it exits
(``Preemption.ignore``): its exit status is its own, never the default action of a late signal during MPI_Finalize.

Engines and the proxy ignore SIGUSR1 (``serving.serve_announced``): under SLURM a signal to the step reaches
every process of it. ``kill -USR2 PID`` dumps a rank's stacks (``jobs/train.py``).

Invariants (tests/integration/test_preempt_resume.py)
- The resume state is consistent: the checkpoint, the version, the step records and the SchedState counters
  belong to the same optimizer step; a buffered group was never trained (no step is half applied).
- A rank whose role has ended exits with its own status (0 or PREEMPTED_EXIT) even when a preemption signal
  arrives while the interpreter and MPI finalize (tests/unit/test_preempt_signals.py).
- A resumed run numbers its steps on from the saved ones, and its first ``resumed`` event shows the saved
  staleness counters (``trained_batches``, ``lag_sum``) and admission window unchanged.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable

from gyre_hpc import resume
from gyre_hpc.runtime.batches import FixedBatches

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: seconds rank 0 waits for the step already out (its gradients, the optimizer, the STEPPED record)
PENDING_STEP_TIMEOUT_S = 120.0


class Preemption:
    """The first preemption signal a rank receives; ``on_signal`` runs inside the handler (keep it tiny)."""

    def __init__(self, on_signal: Callable[[], None] = lambda: None):
        self.signal: str | None = None
        self.at: float | None = None
        self.on_signal = on_signal

    def install(self) -> "Preemption":
        for s in SIGNALS:
            signal.signal(s, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.signal is None:
            self.signal, self.at = signal.Signals(signum).name, time.monotonic()
            self.on_signal()

    def ignore(self) -> None:
        """The shutdown has begun: from now on the preemption signals are ignored. Python gives a signal with a
        Python handler its default action back when the interpreter finalizes, and MPI_Finalize runs after that:
        a late SIGUSR1/SIGTERM (mpirun or srun ending the other ranks once one exited 75) would kill a rank that
        was exiting in order. SIGKILL still ends a rank that hangs."""
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def overdue(self) -> bool:
        return self.at is not None and time.monotonic() - self.at > PENDING_STEP_TIMEOUT_S


def snapshot(server, hub, rollouts, steps: list[dict], carry: dict, wall_s: float) -> dict:
    """Rank 0's resume state (gyre_hpc.resume) at a quiet point: no step pending, no group going out."""
    buffer = [{"gid": g.gid, "tito": str(rollouts.tito_path(g.gid)), "runs": g.runs, "rewards": list(g.rewards),
               "trained_tokens": int(g.trained_tokens), "gen_versions": [int(v) for v in g.gen_versions]}
              for g in [*hub.buffer(), *(rollouts.batches.holding() if rollouts.batches else [])]]
    counters = {"wall_s": carry.get("wall_s", 0.0) + wall_s,
                "runs_finished": carry.get("runs_finished", 0) + rollouts.ended_runs,
                "groups": rollouts.groups, "build_errors": rollouts.errors, "segments": carry.get("segments", 0) + 1,
                "proxy": carry.get("proxy", {})}
    return {"version": hub.version, "sched": resume.sched_snapshot(server.state), "steps": steps, "buffer": buffer,
            "next_gid": rollouts.next_gid, "counters": counters}


def restore(saved: dict, server, hub, rollouts, now: float) -> list:
    """Put a loaded resume state back into a fresh rank 0 (before the allocator's first decision)."""
    from gyre_hpc.runtime.rollouts import work_s

    groups = [rollouts.rebuild(g) for g in saved["buffer"]]
    hub.restore(groups, saved["version"])
    rollouts.next_gid = saved["next_gid"]
    if rollouts.batches is not None:  # fixed batches count on from the next group admitted
        rollouts.batches = FixedBatches(rollouts.batches.B, base=saved["next_gid"])
    rollouts.groups = list(saved["counters"]["groups"])
    rollouts.errors = list(saved["counters"]["build_errors"])
    resume.restore_sched(server.state, saved["sched"], len(groups), work_s(groups), now)
    return groups


def add_proxy(prev: dict, now: dict) -> dict:
    """Proxy counters summed over the segments of a run (the proxy restarts with the run)."""
    keys = set(prev) | set(now)
    return {k: (prev.get(k) or 0) + (now.get(k) or 0) for k in keys
            if isinstance(prev.get(k, 0), (int, float)) and isinstance(now.get(k, 0), (int, float))}


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / "latest"
