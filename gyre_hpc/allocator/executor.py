"""The live executor (``LiveExecutor``): cell messages → ``SchedState`` → the policy's decisions, with no clock and no I/O.

It is the live counterpart of the simulator's event handlers: every state change goes through
``transitions`` (shared with the simulator) and every decision comes from ``policy.decide(state, now)``,
the same policy object the simulator drives. The server (``server.py``) owns the transport, the clock and
the event log; this class only turns facts into state and decisions into orders.

Invariants (tests/unit/test_allocator_live.py)
- A message is checked completely before it changes anything: a rejected message (``ProtocolError``)
  leaves the state as it was.
- A message from cell c's rank must be about cell c; a LOST cell's messages are rejected, and no order
  (``SwitchTo``) is ever produced for a LOST cell.
- ``SwitchDone`` must answer the pending order of that cell (same order id and target role).
- ``EngineDied`` / ``EngineRestarted`` come only from a cell that rolls out (ROLLOUT, or DRAINING: the order to
  train may not have reached it yet); they are logged and change no state (the cell keeps its role, the proxy
  re-places the dead engine's runs and its next ``RunsChanged`` shows where).
- Only the core cell reports optimizer steps; a step raises the version by exactly one.
- ``RunsChanged`` is an absolute snapshot (runs per cell, runs ended in all): a newer one supersedes an
  older, so a rejected one loses nothing. Runs reported on a LOST cell count as parked.
- ``state.unfinished_runs == runs started - runs ended`` and ``parked_runs == unfinished_runs -
  sum(cell.runs) >= 0`` after every message (``SchedState.check`` holds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gyre_hpc.allocator import transitions as tr
from gyre_hpc.allocator.messages import (Bye, CellFailed, EngineDied, EngineRestarted, Event, GroupsReady, Heartbeat,
                                         Hello, RunsChanged, SwitchDone, SwitchTo, TrainProgress, Welcome)
from gyre_hpc.allocator.policies import Policy
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Admit, Role, Switch, WakeAt
from gyre_hpc.errors import ProtocolError, SchedulingError


@dataclass
class Decision:
    """What one ``decide`` produced: orders to send, queries to admit, new wake-up times (for the log)."""

    switches: list[SwitchTo] = field(default_factory=list)
    admit: int = 0
    wakes: list[float] = field(default_factory=list)


class LiveExecutor:
    def __init__(self, policy: Policy, cells: int, runs_per_query: int, core: int = 0):
        self.policy = policy
        roles = policy.initial_roles(cells, core)
        self.state = SchedState(cells=[CellState(role=r) for r in roles], core=core,
                                runs_per_query=runs_per_query)
        self.hello = [False] * cells
        self.last_seen = [0.0] * cells
        self.pending: dict[int, tuple[int, Role, float]] = {}  # cell -> (order id, target, ordered at)
        self.wakes: set[float] = set()
        self.orders_sent = 0
        self.runs_started = self.runs_ended = 0

    # ------------------------------------------------------------------ facts
    @property
    def lost(self) -> list[int]:
        return self.state.cells_in(Role.LOST)

    @property
    def core_lost(self) -> bool:
        return self.state.cells[self.state.core].role is Role.LOST

    def welcome(self, cell: int) -> Welcome:
        return Welcome(cell=cell, role=self.state.cells[cell].role, core=self.state.core,
                       streaming=self.policy.streaming, mu=self.policy.mu)

    def apply(self, msg: Event, now: float, source: int | None = None) -> dict | None:
        """Apply one event (``source`` = the sending cell, None for rank 0 itself); returns the log record
        of the change, or None when nothing but liveness changed."""
        cell = getattr(msg, "cell", None)
        if cell is not None:
            self._check_cell(msg, cell, source)
        if source is not None:
            self.last_seen[source] = now
        handler = getattr(self, f"_on_{type(msg).__name__}")
        return handler(msg, now)

    def _check_cell(self, msg: Event, cell: int, source: int | None) -> None:
        name = type(msg).__name__
        if not 0 <= cell < len(self.state.cells):
            raise ProtocolError(f"{name}.cell: {cell} is not a cell (there are {len(self.state.cells)})")
        if source is not None and source != cell:
            raise ProtocolError(f"{name}.cell: {cell}, but it came from cell {source}'s rank")
        if self.state.cells[cell].role is Role.LOST:
            raise ProtocolError(f"{name}: cell {cell} is lost; its messages are ignored")
        if not self.hello[cell] and not isinstance(msg, Hello):
            raise ProtocolError(f"{name}: cell {cell} has not said Hello")

    def _on_Hello(self, m: Hello, now: float) -> dict:
        if self.hello[m.cell]:
            raise ProtocolError(f"Hello: cell {m.cell} already said Hello")
        self.hello[m.cell] = True
        return {"event": "hello", "cell": m.cell, "rank": m.rank, "node": m.node, "pid": m.pid}

    def _on_Heartbeat(self, m: Heartbeat, now: float) -> None:
        return None

    def _on_SwitchDone(self, m: SwitchDone, now: float) -> dict:
        pend = self.pending.get(m.cell)
        if pend is None or pend[:2] != (m.order, m.role):
            want = "no switch" if pend is None else f"order {pend[0]} to {pend[1].value}"
            raise ProtocolError(f"SwitchDone: cell {m.cell} reports order {m.order} to {m.role.value}; "
                                f"pending is {want}")
        del self.pending[m.cell]
        tr.finish_switch(self.state, m.cell, now)
        return {"event": "switch_done", "cell": m.cell, "role": m.role.value, "order": m.order,
                "timing": dict(m.timing), "total_s": now - pend[2]}

    def _on_RunsChanged(self, m: RunsChanged, now: float) -> dict:
        st = self.state
        if len(m.runs) != len(st.cells):
            raise ProtocolError(f"RunsChanged.runs: {len(m.runs)} counts for {len(st.cells)} cells")
        if m.ended < self.runs_ended or m.ended > self.runs_started:
            raise ProtocolError(f"RunsChanged.ended: {m.ended} runs ended in all, but {self.runs_ended} had "
                                f"already ended and {self.runs_started} were started")
        unfinished = self.runs_started - m.ended
        on_cells = [0 if c.role is Role.LOST else n for c, n in zip(st.cells, m.runs)]  # lost: parked
        if sum(on_cells) > unfinished:
            raise ProtocolError(f"RunsChanged.runs: {sum(on_cells)} runs on cells exceed {unfinished} unfinished")
        self.runs_ended = m.ended
        st.unfinished_runs = unfinished
        for c, n in zip(st.cells, on_cells):
            c.runs = n
        st.parked_runs = unfinished - sum(on_cells)
        return {"event": "runs", "runs": on_cells, "ended": m.ended, "parked": st.parked_runs}

    def _on_GroupsReady(self, m: GroupsReady, now: float) -> dict:
        self._guard(tr.groups_ready, self.state, m.groups, m.work_s, now)
        return {"event": "groups_ready", "groups": m.groups, "work_s": m.work_s,
                "ready": self.state.ready_groups}

    def _on_TrainProgress(self, m: TrainProgress, now: float) -> dict:
        st = self.state
        role = st.cells[m.cell].role
        if role not in (Role.TRAIN, Role.LOADING):
            raise ProtocolError(f"TrainProgress: cell {m.cell} is {role.value}, not training")
        step = m.version - st.version
        if m.cell != st.core and (step or m.optimizing):
            raise ProtocolError(f"TrainProgress: cell {m.cell} is a satellite; only core cell {st.core} steps")
        if step not in (0, 1):
            raise ProtocolError(f"TrainProgress.version: {m.version} after {st.version}; one step at a time")
        if m.groups > st.unprocessed_groups or (step and st.ready_groups < self.policy.cfg.batch_groups):
            raise ProtocolError(f"TrainProgress: {m.groups} groups trained (step {bool(step)}) but "
                                f"{st.unprocessed_groups} were waiting and {st.ready_groups} are ready")
        tr.groups_trained(st, m.groups, m.work_s)
        if step:
            tr.step_done(st, self.policy.cfg.batch_groups, m.mean_lag, now, m.lag_tokens)
        if m.cell == st.core:
            st.optimizing = m.optimizing
        rec = {"event": "train_progress", "cell": m.cell, "groups": m.groups, "version": m.version,
               "optimizing": m.optimizing, "work_s": m.work_s}
        if step:
            rec.update(event="step", steps_done=st.steps_done, mean_lag=m.mean_lag)
        return rec

    def _on_EngineDied(self, m: EngineDied, now: float) -> dict:
        self._rolling_out(m)
        return {"event": "engine_died", "cell": m.cell, "pid": m.pid, "exit_code": m.exit_code, "engine": m.engine,
                "calls_moved": m.calls_moved, "runs_moved": m.runs_moved, "calls_lost": m.calls_lost}

    def _on_EngineRestarted(self, m: EngineRestarted, now: float) -> dict:
        self._rolling_out(m)
        return {"event": "engine_restarted", "cell": m.cell, "pid": m.pid, "start_s": m.start_s,
                "version": m.version, "engine": m.engine, "restarts": m.restarts}

    def _rolling_out(self, m: Event) -> None:
        role = self.state.cells[m.cell].role
        if role not in (Role.ROLLOUT, Role.DRAINING):
            raise ProtocolError(f"{type(m).__name__}: cell {m.cell} is {role.value}; only a rolling-out cell "
                                f"has an engine")

    def _on_CellFailed(self, m: CellFailed, now: float) -> dict:
        return self.lose(m.cell, now, f"failed: {m.reason}")

    def _on_Bye(self, m: Bye, now: float) -> dict:
        return self.lose(m.cell, now, "left (Bye before Shutdown)")

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except SchedulingError as exc:
            raise ProtocolError(str(exc)) from None

    # ------------------------------------------------------------------ losses
    def lose(self, cell: int, now: float, reason: str) -> dict:
        """Mark ``cell`` LOST (its runs are parked for re-placement, its pending switch forgotten)."""
        silent = now - self.last_seen[cell]
        self.pending.pop(cell, None)
        rehomed = tr.lose_cell(self.state, cell, now)
        return {"event": "lost", "cell": cell, "reason": reason, "silent_s": silent, "runs_rehomed": rehomed,
                "unfinished_runs": self.state.unfinished_runs}

    def silent(self, now: float, timeout: float) -> list[int]:
        """Cells that said Hello, are not lost, and have sent nothing for more than ``timeout`` seconds."""
        return [c for c, cs in enumerate(self.state.cells)
                if self.hello[c] and cs.role is not Role.LOST and now - self.last_seen[c] > timeout]

    # ------------------------------------------------------------------ decisions
    def wake_due(self, now: float) -> bool:
        due = {t for t in self.wakes if t <= now}
        self.wakes -= due
        return bool(due)

    def decide(self, now: float) -> Decision:
        """Ask the policy; start the switches it orders; return what the server must send and admit."""
        out = Decision()
        for order in self.policy.decide(self.state, now):
            if isinstance(order, Switch):
                tr.begin_switch(self.state, order, now)
                self.orders_sent += 1
                self.pending[order.cell] = (self.orders_sent, order.target, now)
                out.switches.append(SwitchTo(cell=order.cell, role=order.target, order=self.orders_sent))
            elif isinstance(order, Admit):
                out.admit += order.queries
            elif isinstance(order, WakeAt) and order.t not in self.wakes:
                self.wakes.add(order.t)
                out.wakes.append(order.t)
        return out

    def admitted(self, queries: int) -> None:
        """The harness started ``queries`` of the admitted queries (their runs wait parked until placed)."""
        runs = queries * self.state.runs_per_query
        tr.admit(self.state, queries, runs)
        self.state.parked_runs += runs
        self.runs_started += runs

    @property
    def next_wake(self) -> float | None:
        return min(self.wakes) if self.wakes else None
