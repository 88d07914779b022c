"""The allocator loop on rank 0: messages in → ``SchedState`` → ``policy.decide`` → orders out.

One loop, on an injected clock and any ``Transport``::

    start:  log "start"; wait for every cell's Hello (answer each with a Welcome: starting role, core, mu)
            and for ``ready()`` (live: every rollout cell's engine serves), then log "started" and decide
    step:   drain events (from cells over the transport, and from rank 0 itself via ``post``)
            → LiveExecutor.apply (state changes go through the transitions the simulator uses)
            → cells silent for heartbeat_timeout_s (or without Hello after hello_timeout_s) become LOST
            → if anything changed or a WakeAt is due: policy.decide(state, now) → SwitchTo to cells,
              Admit to the harness callback (after a resume, first ``readmit`` queries), WakeAt remembered
    idle:   sleep with exponential back-off (poll_backoff_min_s .. poll_backoff_max_s), never past a WakeAt
    stop:   ``allocator.steps`` optimizer steps done (or the core cell, or every cell, lost) →
            Shutdown to every cell that is not LOST, Bye awaited up to shutdown_timeout_s, transport closed

Every order and every state-changing message is a line of the event log (``eventlog.py``).

Invariants (tests/unit/test_allocator_server.py, tests/integration/test_mpi_transport.py)
- Decisions come only from the policy object; the server never decides a role itself.
- A LOST cell is never sent anything, Shutdown included.
- A malformed or out-of-protocol message is logged as ``rejected`` and changes nothing; the loop goes on.
- The shutdown is always attempted, also when the loop fails (the error is re-raised after it); losing the
  core cell ends the run with ``CellLostError`` after the orderly shutdown of the other cells.
"""
from __future__ import annotations

import queue
from typing import Callable

from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.allocator.executor import LiveExecutor
from gyre_hpc.allocator.messages import Bye, Event, Message, Shutdown
from gyre_hpc.allocator.policies import Policy
from gyre_hpc.allocator.transport import Backoff, Transport
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import AllocatorConfig
from gyre_hpc.errors import CellLostError, ProtocolError, SchedulingError

MAX_MESSAGES_PER_STEP = 1000


class AllocatorServer:
    """Drives ``policy`` over the cells behind ``transport`` (rank 0; rank c + 1 leads cell c).

    ``admit(n) -> started`` is called with every Admit order: the harness starts up to ``n`` new queries and
    returns how many it started. The server owns ``transport`` and ``log`` and closes both at shutdown.
    """

    def __init__(self, policy: Policy, cfg: AllocatorConfig, transport: Transport, log: EventLog,
                 admit: Callable[[int], int], runs_per_query: int, core: int = 0,
                 ready: Callable[[], bool] = lambda: True):
        self.policy, self.cfg, self.transport, self.log, self.admit = policy, cfg, transport, log, admit
        self.ready = ready
        self.clock = transport.clock
        self.ex = LiveExecutor(policy, transport.size - 1, runs_per_query, core)
        self.inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.t0 = self.clock.now()
        self.started = False
        self.closed = False
        #: queries to start at the first decision, before the policy's (a resume: those in flight at the
        #: preemption, live/preempt.py; the policy admitted them in the segment before, within its window)
        self.readmit = 0

    @property
    def state(self):
        return self.ex.state

    def post(self, msg: Event) -> None:
        """Hand the loop an event observed on rank 0 (proxy: RunsChanged; harness: GroupsReady). Thread-safe."""
        self.inbox.put(msg)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Run until the stop condition; returns a summary (steps, version, lost cells, missing Byes)."""
        self.start()
        backoff = Backoff(self.clock, self.cfg.poll_backoff_min_s, self.cfg.poll_backoff_max_s)
        reason = "interrupted"
        try:
            while (stop := self.stop_reason()) is None:
                if self.step():
                    backoff.reset()
                else:
                    wake = self.ex.next_wake
                    backoff.wait(None if wake is None else wake - self.clock.now())
            reason = stop
        except BaseException as exc:
            reason = f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            summary = self.shutdown(reason)
        if self.ex.core_lost:
            raise CellLostError(f"core cell {self.state.core} was lost after {self.state.steps_done} steps; "
                                f"the other cells were shut down (see {self.log.path})")
        return summary

    def start(self) -> None:
        self.t0 = self.clock.now()
        self.log.write({"event": "start", "policy": self.policy.name, "cells": len(self.state.cells),
                        "core": self.state.core, "roles": [c.role.value for c in self.state.cells],
                        "steps": self.cfg.steps, "streaming": self.policy.streaming, "mu": self.policy.mu})

    def stop_reason(self) -> str | None:
        if self.state.steps_done >= self.cfg.steps:
            return f"{self.state.steps_done} optimizer steps done"
        if self.ex.core_lost:
            return f"core cell {self.state.core} lost"
        return None

    def step(self) -> bool:
        """One pass: apply pending events, check liveness, decide if needed. True if anything changed."""
        now = self.clock.now()
        changed = False
        for source, msg in self._drain():
            changed |= self._apply(msg, now, source)
        changed |= self._liveness(now)
        if not self.started and all(self.ex.hello[c] or r.role is Role.LOST
                                    for c, r in enumerate(self.state.cells)) and self.ready():
            self.started = changed = True
            self.log.write({"event": "started", "after_s": round(now - self.t0, 3)})
        due = self.ex.wake_due(now)
        if self.started and (changed or due) and self.stop_reason() is None:
            self._decide(now)
        return changed

    def _drain(self):
        for _ in range(MAX_MESSAGES_PER_STEP):
            try:
                yield None, self.inbox.get_nowait()
                continue
            except queue.Empty:
                pass
            try:
                got = self.transport.poll()
            except ProtocolError as exc:
                self._reject(None if exc.source is None else exc.source - 1, None, exc)
                continue
            if got is None:
                return
            yield got[0] - 1, got[1]

    def _apply(self, msg: Event, now: float, source: int | None) -> bool:
        try:
            record = self.ex.apply(msg, now, source)
        except ProtocolError as exc:
            self._reject(source, msg, exc)
            return False
        if record is None:
            return False
        self.log.write(record)
        if record["event"] == "hello":
            self._send(msg.cell, self.ex.welcome(msg.cell), now)
        return True

    def _reject(self, cell: int | None, msg: Message | None, exc: Exception) -> None:
        self.log.write({"event": "rejected", "cell": cell, "type": type(msg).__name__ if msg else None,
                        "error": str(exc)})

    def _liveness(self, now: float) -> bool:
        lost = [(c, f"heartbeat: silent more than {self.cfg.heartbeat_timeout_s} s")
                for c in self.ex.silent(now, self.cfg.heartbeat_timeout_s)]
        if not self.started and now - self.t0 > self.cfg.hello_timeout_s:
            lost += [(c, f"no Hello within {self.cfg.hello_timeout_s} s") for c, cs in enumerate(self.state.cells)
                     if not self.ex.hello[c] and cs.role is not Role.LOST]
        for cell, reason in lost:
            self.log.write(self.ex.lose(cell, now, reason))
        return bool(lost)

    def _decide(self, now: float) -> None:
        if self.readmit:  # a resume: the queries in flight at the preemption start again first
            n, self.readmit = self.readmit, 0
            self._admit(n, resumed=True)
        d = self.ex.decide(now)
        for order in d.switches:
            self.log.write({"event": "order", "order": "switch", "id": order.order, "cell": order.cell,
                            "target": order.role.value})
            self._send(order.cell, order, now)
        if d.admit:
            self._admit(d.admit)
        for t in d.wakes:
            self.log.write({"event": "order", "order": "wake", "at": t})

    def _admit(self, queries: int, **why) -> None:
        started = self.admit(queries)
        if not 0 <= started <= queries:
            raise SchedulingError(f"the admit callback started {started} of {queries} queries")
        self.ex.admitted(started)
        self.log.write({"event": "order", "order": "admit", "queries": queries, "started": started, **why})

    def _send(self, cell: int, msg: Message, now: float) -> bool:
        if self.state.cells[cell].role is Role.LOST:
            raise SchedulingError(f"{type(msg).__name__} for lost cell {cell}")  # unreachable by the invariants
        try:
            self.transport.send(cell + 1, msg)
            return True
        except CellLostError as exc:
            self.log.write(self.ex.lose(cell, now, f"unreachable: {exc}"))
            return False

    # ------------------------------------------------------------------ orderly shutdown
    def abandon_shutdown(self) -> bool:
        """True: stop waiting for Byes (the launcher is tearing the job down; a subclass knows)."""
        return False

    def shutdown(self, reason: str) -> dict:
        """Shutdown to every cell that is not LOST, wait for their Byes, close the transport and the log."""
        if self.closed:
            raise SchedulingError("the allocator was already shut down")
        now = self.clock.now()
        self.log.write({"event": "shutdown", "reason": reason})
        live = [c for c, cs in enumerate(self.state.cells) if cs.role is not Role.LOST]
        waiting = {c for c in live if self._send(c, Shutdown(reason=reason, lost=tuple(self.ex.lost)), now)}
        deadline = now + self.cfg.shutdown_timeout_s
        backoff = Backoff(self.clock, self.cfg.poll_backoff_min_s, self.cfg.poll_backoff_max_s)
        while waiting and self.clock.now() < deadline and not self.abandon_shutdown():
            try:
                got = self.transport.poll()
            except ProtocolError:
                continue
            if got is None:
                backoff.wait(deadline - self.clock.now())
            elif isinstance(got[1], Bye) and got[0] - 1 in waiting:
                waiting.discard(got[0] - 1)
                self.log.write({"event": "bye", "cell": got[0] - 1})
        summary = {"reason": reason, "steps_done": self.state.steps_done, "version": self.state.version,
                   "lost": self.ex.lost, "no_bye": sorted(waiting)}
        self.log.write({"event": "stop", **summary})
        self.transport.close()
        self.log.close()
        self.closed = True
        return summary
