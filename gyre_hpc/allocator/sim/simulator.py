"""The discrete-event simulator: drives one policy over a workload in virtual time.

Events: a run finishing on a cell, a run's timeout, a role switch completing, a satellite's weight pull
completing, a training group finishing its forward/backward, an optimizer step completing, and a policy
wake-up. After every event the policy is asked ``decide(state, now)`` and its orders are applied.

Model (docs/simulator.md has the full account)
- Runs are admitted a query (group) at a time and placed on the least-loaded rollout cell. A run's
  wall-clock timeout starts when it is first placed; partial work of a timed-out run is trained.
- A cell leaving rollout hands its runs to the other rollout cells (KV blocks moved: ``kv_transfer_s``
  more work) or parks them when none has room (KV dropped: a re-prefill of ``reprefill_tokens`` on resume).
  Parked runs make no progress; their wall-clock timeout keeps running.
- A group is ready when all its runs ended. A streaming policy hands ready groups to the trainer in
  completion order and starts on whatever is ready; the others train fixed batches (batch b = the b-th B
  admitted queries), each only when all its groups are ready, in order — so a batch waits for its slowest
  query. Group work is
  tokens / train_tok_s_per_cell cell-seconds, shared by the active training cells; the core applies the
  optimizer step every B groups (``optimizer_s``); a satellite pulls the core's weights
  (weight_bytes / pull_bytes_per_s) when it joins and after every optimizer step.
- Rollout engines generate with the newest version from the moment an optimizer step completes.

The training side (ready groups, the trainer, optimizer steps) is ``sim/trainer.py``.

Invariants
- Same inputs and seed → identical results (the event heap breaks ties by sequence number).
- Each order is applied exactly as the policy emitted it; the simulator never makes a role decision.
- Staleness is measured per trained token (``staleness.LagLedger``).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from gyre_hpc.allocator import transitions as tr
from gyre_hpc.allocator.policies import Policy
from gyre_hpc.allocator.sim.events import EventQueue
from gyre_hpc.allocator.sim.rollout import DONE, PARKED, RolloutPool
from gyre_hpc.allocator.batches import FixedBatches
from gyre_hpc.allocator.sim.trainer import PULL_DONE, TrainerSide
from gyre_hpc.allocator.sim.workload import SimWorkload
from gyre_hpc.allocator.staleness import LagLedger
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Admit, Role, Switch, WakeAt
from gyre_hpc.config import SchedulerConfig, SimConfig
from gyre_hpc.errors import SchedulingError

CELL_DONE, TIMEOUT, SWITCH_DONE, WAKE = 0, 1, 2, 6  # 3, 4, 5: trainer events (sim/trainer.py)


class Simulation(TrainerSide):
    def __init__(self, policy: Policy, sim: SimConfig, sched: SchedulerConfig, wl: SimWorkload, cells: int,
                 timeout_s: float):
        self.policy, self.sim, self.B, self.timeout = policy, sim, sched.batch_groups, timeout_s
        self.wl = wl
        roles = policy.initial_roles(cells)
        self.state = SchedState(cells=[CellState(role=r) for r in roles], runs_per_query=wl.max_group)
        self.pool = RolloutPool(cells, wl.work_s.tolist(), sim.kv_slots_per_cell, sim.half_load,
                                wl.tool_frac, sched.capacity_runs_per_cell,
                                math.inf if sim.engine_slots is None else sim.engine_slots,
                                sim.load_model == "calls")
        for c, r in enumerate(roles):
            self.pool.active[c] = r is Role.ROLLOUT
        self.q = EventQueue()
        sizes = np.diff(wl.offsets)
        self.q_of = np.repeat(np.arange(wl.queries), sizes).tolist()
        self.g_left = sizes.tolist()
        self.q_start = [math.nan] * wl.queries
        self.q_end = [math.nan] * wl.queries
        self.q_timeout = [False] * wl.queries
        self.tok_rate = wl.tok_per_work_s.tolist()
        self.train_window = wl.train_window_s.tolist()
        self.run_start = [math.nan] * len(self.q_of)
        self.next_query = 0
        self.ledger = LagLedger(sched.max_staleness)
        self.reprefill_s = sim.reprefill_tokens / sim.prefill_tok_s
        self.pull_s = sim.weight_bytes / sim.pull_bytes_per_s
        # trainer
        self.tq: deque[int] = deque()
        self.batches: FixedBatches[int] = FixedBatches(self.B)
        self.g_work: dict[int, float] = {}
        self.g_trained: dict[int, list[tuple[list[int], list[float]]]] = {}
        self.cur, self.cur_left, self.tr_t, self.tr_stamp = -1, 0.0, 0.0, 0
        self.step_n = 0
        self.train_active = {c for c, r in enumerate(roles) if r is Role.TRAIN}
        self.batch_lag = [0.0, 0.0]
        self.train_busy = 0.0
        self.wakes: set[float] = set()
        self.timeline = [[(0.0, r.value)] for r in roles]
        self.step_times: list[float] = []
        self.end = 0.0

    # ================================================================== main loop
    def run(self) -> float:
        """Simulate until the configured number of optimizer steps; returns the end time (s)."""
        self._decide(0.0)
        q, st, steps = self.q, self.state, self.sim.steps
        handlers = (self._on_cell_done, self._on_timeout, self._on_switch_done, self._on_pull_done,
                    self._on_train_done, self._on_opt_done, self._on_wake)
        while st.steps_done < steps:
            if not q:
                raise SchedulingError(f"{self.policy.name}: simulation stalled at t={q.now:.0f}s after "
                                      f"{st.steps_done} steps ({st.inflight_groups} groups in flight, "
                                      f"{st.ready_groups} ready, roles {[c.role.value for c in st.cells]})")
            if q.popped > self.sim.max_events:
                raise SchedulingError(f"{self.policy.name}: more than sim.max_events={self.sim.max_events} events")
            t, _, kind, a, b = q.pop()
            handlers[kind](t, a, b)
            self._flush(t)
            self._decide(t)
        self.end = q.now
        return q.now

    def _flush(self, now: float) -> None:
        pool = self.pool
        for c in pool.flush_rates():
            self.state.cells[c].runs = pool.load[c]
            nxt = pool.next_finish(c)
            if nxt is not None:
                self.q.push(nxt[0], CELL_DONE, c, pool.stamp[c])
        self.state.parked_runs = pool.parked_count

    def _decide(self, now: float) -> None:
        orders = self.policy.decide(self.state, now)
        if not orders:
            return
        switches = [o for o in orders if isinstance(o, Switch)]
        if switches:
            self._apply_switches(switches, now)
        for o in orders:
            if isinstance(o, Admit):
                self._admit(o.queries, now)
            elif isinstance(o, WakeAt) and o.t not in self.wakes and o.t > now:
                self.wakes.add(o.t)
                self.q.push(o.t, WAKE)
        self._flush(now)

    # ================================================================== rollout events
    def _admit(self, n: int, now: float) -> None:
        st, wl = self.state, self.wl
        for _ in range(n):
            qi = self.next_query
            if qi >= wl.queries:
                return
            self.next_query += 1
            self.q_start[qi] = now
            tr.admit(st, 1, int(wl.offsets[qi + 1] - wl.offsets[qi]))
            for i in range(wl.offsets[qi], wl.offsets[qi + 1]):
                self._start_or_park(i, now)

    def _start_or_park(self, i: int, now: float) -> None:
        if self.pool.place(i, now, self.state.version):
            self._started(i, now)
        else:
            self.pool.park(i)

    def _started(self, i: int, now: float) -> None:
        if math.isnan(self.run_start[i]):
            self.run_start[i] = now
            self.q.push(now + self.timeout, TIMEOUT, i)

    def _refill(self, now: float) -> None:
        for i in self.pool.fill(now, self.state.version):
            self._started(i, now)

    def _on_cell_done(self, now: float, c: int, stamp: int) -> None:
        pool = self.pool
        if stamp != pool.stamp[c]:
            return
        nxt = pool.next_finish(c)
        if nxt is None:
            return
        i = nxt[1]
        pool.leave(i, now)
        pool.left[i] = 0.0
        self._run_ended(i, now, timed_out=False)
        self._refill(now)

    def _on_timeout(self, now: float, i: int, _: int) -> None:
        pool = self.pool
        where = pool.where[i]
        if where == DONE:
            return
        if where >= 0:
            pool.leave(i, now)
        elif where == PARKED:
            pool.unpark_done(i)
        self._run_ended(i, now, timed_out=True)
        self._refill(now)

    def _run_ended(self, i: int, now: float, timed_out: bool) -> None:
        self.pool.where[i] = DONE
        self.state.unfinished_runs -= 1
        qi = self.q_of[i]
        self.q_timeout[qi] |= timed_out
        self.g_left[qi] -= 1
        if self.g_left[qi]:
            return
        st = self.state
        self.q_end[qi] = now
        trained = [self.trained(r) for r in range(self.wl.offsets[qi], self.wl.offsets[qi + 1])]
        self.g_trained[qi] = trained
        work = sum(sum(tokens) for _, tokens in trained) / self.sim.train_tok_s_per_cell
        self.g_work[qi] = work
        if self.policy.streaming:
            tr.groups_ready(st, 1, work, now)
            self.tq.append(qi)
        else:
            st.inflight_groups -= 1  # ready, but held until its whole batch is (fixed batches)
            st.set_ready(st.ready_groups + 1, now)
            self._release_batches(qi)
        self._tr_kick(now)

    # ================================================================== role switches
    def _apply_switches(self, switches: list[Switch], now: float) -> None:
        st, pool = self.state, self.pool
        for s in switches:
            cell = st.cells[s.cell]
            if cell.role is Role.ROLLOUT:
                pool.advance(s.cell, now)
            else:
                self._tr_advance(now)
            role = tr.begin_switch(st, s, now)  # raises SchedulingError on a forbidden switch
            self.timeline[s.cell].append((now, role.value))
            if role is Role.DRAINING:
                pool.active[s.cell] = False
                self.q.push(now + self.sim.to_train_s, SWITCH_DONE, s.cell)
            else:
                self.train_active.discard(s.cell)
                self.q.push(now + self.sim.to_rollout_s, SWITCH_DONE, s.cell)
                self._tr_kick(now)
        for s in switches:
            if s.target is Role.TRAIN:
                self._move_runs_off(s.cell, now)

    def _move_runs_off(self, c: int, now: float) -> None:
        pool = self.pool
        for i in pool.evict(c, now, 0.0):
            if pool.best_cell() >= 0:
                pool.left[i] += self.sim.kv_transfer_s
                pool.place(i, now, self.state.version)
            else:
                pool.left[i] += self.reprefill_s
                pool.park(i)

    def _on_switch_done(self, now: float, c: int, _: int) -> None:
        if self.state.cells[c].role is Role.LOADING:
            self.pool.advance(c, now)
        role = tr.finish_switch(self.state, c, now)
        self.timeline[c].append((now, role.value))
        if role is Role.TRAIN:
            if c == self.state.core:
                self._tr_advance(now)
                self.train_active.add(c)
                self._tr_kick(now)
            else:
                self.q.push(now + self.pull_s, PULL_DONE, c)
        else:
            self.pool.active[c] = True
            self._refill(now)
            if self.sim.load_model == "calls":  # the proxy routes each call to the least-loaded engine
                self.pool.rebalance(now, self.state.version)

    def _on_pull_done(self, now: float, c: int, _: int) -> None:
        if self.state.cells[c].role is Role.TRAIN and c not in self.train_active:
            self._tr_advance(now)
            self.train_active.add(c)
            self._tr_kick(now)

    def _on_wake(self, now: float, a: int, b: int) -> None:
        self.wakes.discard(now)
