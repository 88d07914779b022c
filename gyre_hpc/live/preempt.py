"""Preemption and resume of a live run (edge: signals, files): the signal handlers and rank 0's resume state.

::

    SIGTERM / SIGUSR1 on a rank     (srun and scancel signal the step; on submitit's SLURM tasks also the signal
                                    submitit asks for before the time limit, USR2: gyre_hpc.lifecycle.rank_signals),
                                    or RUN_DIR/preempt.request (written by
                                    ``gyre train`` when it gets the signal: rank 0 polls it, no rank is signalled,
                                    so a rank still starting up cannot die of it; the sbatch script writes it too,
                                    before it forwards the signal: there rank 0's SIGTERM without it is srun's
                                    teardown, live/lost.py ``SrunTeardown``)
      rank 0:  Rollouts.close (no group starts or becomes ready) · Hub.freeze (no group goes out) · no more
               decisions · wait until no step is pending and the allocator applied the core's last step
               · write RUN_DIR/resume (gyre_hpc.lifecycle.resume) · event ``preempted`` · Shutdown("preempted: SIG") to the cells
      cells:   note the signal, keep going until rank 0's Shutdown (the core never starts a step it cannot finish:
               it steps only on a whole batch, and none goes out after the freeze)
      every rank exits with PREEMPTED_EXIT; ``gyre train`` prints how to resume, sbatch requeues the job
    resume:  the core loads resume/checkpoint; rank 0 restores the hub's buffer (rebuilt from the TITO files),
             the SchedState counters, the step records and the run counters; event ``resumed``

The buffer is the hub's untrained groups, then (fixed batches) the ready groups still held for an incomplete
batch, by gid; each keeps its ``ready_version`` (a held group: the version it would be stamped with now), so a
resumed run splits its staleness exactly as the preempted one would have. The queries in flight at the
preemption (admitted, not ready) are saved as ``inflight``; the resume re-issues them before any new query
(``allocator.preempt_inflight: reissue``) or drops them (``drop``), and the summary counts either
(``queries_reissued``, ``queries_dropped_at_preempt``). A resume restores the batch former too: a group held
for an incomplete fixed batch (``held`` in the buffer) is held again, in one batch with the re-issued queries
of its batch, so a re-issuing resume keeps every batch as it was, and a dropping one completes a held batch
with new queries numbered at the resume. The server starts as many queries as were in flight (``readmit``: the
same ones, or those new ones for ``drop``) at its first decision, before the policy's admission: its window
counts the held groups as in flight and admits whole batches only, so it never would (with a window of one
batch it admitted nothing: a submitit time-limit requeue in CI waited forever with half a batch held).

Once its role has ended (run_root returned, the cell said Bye) a rank ignores both signals until it exits
(``Preemption.ignore``): its exit status is its own, never the default action of a late signal during MPI_Finalize.

Engines and the proxy ignore SIGUSR1 (and submitit's time-limit signal on its tasks) (``serving.serve_announced``):
under SLURM a signal to the step reaches every process of it. ``kill -USR2 PID`` dumps a rank's stacks
(``live/rank.py``; ``kill -QUIT PID`` on submitit's tasks, where USR2 is the time limit: gyre_hpc.lifecycle.rank_signals).

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
from pathlib import Path
from typing import Callable

from gyre_hpc.allocator.batches import FixedBatches
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.lifecycle import rank_signals, resume

#: the preemption signals of every path; submitit's SLURM tasks add the time-limit signal (gyre_hpc.lifecycle.rank_signals)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
POLL_S = 0.25
#: seconds rank 0 waits for the step already out (its gradients, the optimizer, the STEPPED record)
PENDING_STEP_TIMEOUT_S = 120.0


class Preemption:
    """The first preemption signal a rank receives; ``on_signal`` runs inside the handler (keep it tiny)."""

    def __init__(self, on_signal: Callable[[], None] = lambda: None, clock: Clock | None = None,
                 signals: tuple[signal.Signals, ...] | None = None):
        self.signal: str | None = None
        self.at: float | None = None  # on ``clock`` (WallClock.now is safe inside a signal handler)
        self.on_signal = on_signal
        self.clock = clock or WallClock()
        #: the signals ``install`` catches and ``ignore`` ignores: this process's (gyre_hpc.lifecycle.rank_signals)
        self.signals = signals if signals is not None else rank_signals.current().nums(rank_signals.current().preempt)

    def install(self) -> "Preemption":
        for s in self.signals:
            signal.signal(s, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        self.request(signal.Signals(signum).name)

    def request(self, name: str) -> None:
        """A preemption named ``name`` (a signal, or the launcher's request file); only the first one counts."""
        if self.signal is None:
            self.signal, self.at = name, self.clock.now()
            self.on_signal()

    def watch(self, path: Path) -> "Preemption":
        """``poll`` looks for the request file ``path`` (``gyre train`` writes the signal's name into it)."""
        self.path, self.polled = Path(path), 0.0
        return self.poll(force=True)

    def poll(self, force: bool = False) -> "Preemption":
        """Take the request file into account (at most every ``POLL_S`` seconds unless ``force``)."""
        path = getattr(self, "path", None)
        if path is None or self.signal is not None or (not force and self.clock.now() - self.polled < POLL_S):
            return self
        self.polled = self.clock.now()
        try:
            name = path.read_text().strip() or "preempt.request"
        except FileNotFoundError:
            return self
        self.request(name)
        return self

    def ignore(self) -> None:
        """The shutdown has begun: from now on the preemption signals are ignored. Python gives a signal with a
        Python handler its default action back when the interpreter finalizes, and MPI_Finalize runs after that:
        a late SIGUSR1/SIGTERM (mpirun or srun ending the other ranks once one exited 75) would kill a rank that
        was exiting in order. SIGKILL still ends a rank that hangs."""
        for s in self.signals:
            signal.signal(s, signal.SIG_IGN)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def overdue(self) -> bool:
        return self.at is not None and self.clock.now() - self.at > PENDING_STEP_TIMEOUT_S


def snapshot(server, hub, rollouts, steps: list[dict], carry: dict, wall_s: float) -> dict:
    """Rank 0's resume state (gyre_hpc.lifecycle.resume) at a quiet point: no step pending, no group going out."""
    held = rollouts.batches.holding() if rollouts.batches else []
    stamped = [(g, int(g.ready_version), False) for g in hub.buffer()]  # the hub stamped these on intake
    stamped += [(g, max(hub.version, *g.gen_versions, 0), True) for g in held]  # what its intake would stamp now
    buffer = [{"gid": g.gid, "tito": str(rollouts.tito_path(g.gid)), "runs": g.runs, "rewards": list(g.rewards),
               "trained_tokens": int(g.trained_tokens), "gen_versions": [int(v) for v in g.gen_versions],
               "ready_version": rv, "held": h} for g, rv, h in stamped]
    inflight = [gid for gid in rollouts.inflight() if gid not in {g["gid"] for g in buffer}]
    counters = {"wall_s": carry.get("wall_s", 0.0) + wall_s,
                "runs_finished": carry.get("runs_finished", 0) + rollouts.ended_runs,
                "groups": rollouts.groups, "build_errors": rollouts.errors, "segments": carry.get("segments", 0) + 1,
                "proxy": carry.get("proxy", {}), "queries_reissued": carry.get("queries_reissued", 0),
                "queries_dropped_at_preempt": carry.get("queries_dropped_at_preempt", 0)}
    return {"version": hub.version, "sched": resume.sched_snapshot(server.state), "steps": steps, "buffer": buffer,
            "next_gid": rollouts.next_gid, "counters": counters, "inflight": inflight}


def reissued(saved: dict, reissue: bool) -> list[int]:
    """The gids a resume starts again: the queries in flight at the preemption, unless they are dropped."""
    return [int(g) for g in saved.get("inflight", [])] if reissue else []


def inflight_counters(saved: dict, reissue: bool) -> dict:
    """The run counters after a resume took the saved in-flight queries (re-issued or dropped)."""
    c, n = saved["counters"], len(saved.get("inflight", []))
    return {**c, "queries_reissued": c.get("queries_reissued", 0) + (n if reissue else 0),
            "queries_dropped_at_preempt": c.get("queries_dropped_at_preempt", 0) + (0 if reissue else n)}


def restore(saved: dict, server, hub, rollouts, now: float, reissue: bool = True) -> list:
    """Put a loaded resume state back into a fresh rank 0 (before the allocator's first decision): the groups the
    hub held go back to it, those held for an incomplete fixed batch back into the batch former, in the batch of
    the queries a resume starts again (``readmit`` on the server: as many as were in flight)."""
    from gyre_hpc.live.rollouts import work_s

    groups = [rollouts.rebuild(g) for g in saved["buffer"]]
    for g, s in zip(groups, saved["buffer"]):  # an older state without it: the floor its own tokens set
        g.ready_version = int(s.get("ready_version", max(saved["version"], *g.gen_versions, 0)))
    rollouts.set_aside_from(saved["next_gid"])  # a periodic state: the dead segment had admitted these gids already
    again = reissued(saved, reissue)
    if not reissue:  # new queries take the dropped ones' places, numbered now: a snapshot before they start has them
        again = list(range(saved["next_gid"], saved["next_gid"] + len(saved.get("inflight", []))))
    rollouts.next_gid = saved["next_gid"] + (0 if reissue else len(again))
    rollouts.reissue(again)
    if rollouts.batches is None:  # streaming: every buffered group is offered
        offered, held = groups, []
    else:  # admission order: held and re-started gids in order, then new ones
        offered = [g for g, s in zip(groups, saved["buffer"]) if not s.get("held")]  # older states: all offered
        held = [g for g, s in zip(groups, saved["buffer"]) if s.get("held")]
        rollouts.batches = FixedBatches(rollouts.batches.B, base=rollouts.next_gid,
                                        first=tuple(sorted([g.gid for g in held] + again)))
        for g in held:  # after a drop, held groups of two batches can fill one
            offered += [x for batch in rollouts.batches.ready(g.gid, g) for x in batch]
        held = rollouts.batches.holding()
    hub.restore(offered, saved["version"])
    rollouts.groups = list(saved["counters"]["groups"])
    rollouts.errors = list(saved["counters"]["build_errors"])
    resume.restore_sched(server.state, saved["sched"], len(offered), work_s(offered), now, held=len(held))
    server.readmit = len(again)  # Rollouts.admit starts ``again`` first; until then inflight() lists them
    return groups


def add_proxy(prev: dict, now: dict) -> dict:
    """Proxy counters summed over the segments of a run (the proxy restarts with the run)."""
    keys = set(prev) | set(now)
    return {k: (prev.get(k) or 0) + (now.get(k) or 0) for k in keys
            if isinstance(prev.get(k, 0), (int, float)) and isinstance(now.get(k, 0), (int, float))}


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / "latest"
