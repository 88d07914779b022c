"""Scripted cells and harness at the allocator's test boundary (the real cell worker and harness are later pieces).

Everything here talks to the real server only through the real protocol: cells through ``CellLink`` over an
``InProcessTransport``, the harness through the admit callback and ``AllocatorServer.post``. The cells act when
the ``ManualClock`` is slept on (``World.attach``), so a whole run takes virtual time and no real time.

The fake trainer lives on the core cell: it takes ready groups from the harness (where the real trainer reads
its data), reports ``TrainProgress`` per group, steps every B groups, and honours ``Welcome.mu`` and
``Welcome.streaming`` as the real trainer will.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from gyre_hpc.allocator.cell_link import CellLink
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.allocator.messages import (GroupsReady, Hello, RunsChanged, Shutdown, SwitchDone, SwitchTo,
                                         TrainProgress, Welcome)
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.server import AllocatorServer
from gyre_hpc.allocator.transport import InProcessWorld
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import AllocatorConfig, SchedulerConfig

SCHED = SchedulerConfig(batch_groups=4, theta=0.5, tau_s=10.0, mu=1, staleness_target=1.0, staleness_gain=0.0,
                        capacity_runs_per_cell=16, satellite_min_work_s=1e9, async_train_cells=2)
ALLOC = AllocatorConfig(steps=2, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0, hello_timeout_s=30.0,
                        poll_backoff_min_s=0.01, poll_backoff_max_s=0.25, shutdown_timeout_s=4.0)


class Recording:
    """The policy object itself, with every ``decide`` call recorded: (now, orders)."""

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def decide(self, state, now):
        orders = self.policy.decide(state, now)
        self.calls.append((now, list(orders)))
        return orders


@dataclass
class Harness:
    """Starts queries on admit; each run ends ``run_s`` later; reports placement snapshots and ready groups."""

    run_s: float = 5.0
    group_s: float = 1.0
    queries: int = 1000
    server: AllocatorServer | None = None
    running: list[float] = field(default_factory=list)
    ready: int = 0
    ended: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, n: int) -> int:
        with self.lock:
            n = min(n, self.queries)
            self.queries -= n
            now = self.server.clock.now()
            self.running += [now + self.run_s] * n
        self._snapshot()
        return n

    def act(self, now: float) -> None:
        with self.lock:
            done = [t for t in self.running if t <= now]
            self.running = [t for t in self.running if t > now]
            self.ended += len(done)
        if done:
            self._snapshot()
            self.server.post(GroupsReady(groups=len(done), work_s=len(done) * self.group_s))
            with self.lock:
                self.ready += len(done)

    def take(self, n: int) -> int:
        with self.lock:
            n = min(n, self.ready)
            self.ready -= n
            return n

    def _snapshot(self) -> None:
        """The proxy's view: unfinished runs spread over the rollout cells in the allocator's state."""
        roles = [c.role for c in self.server.state.cells]
        rollout = [c for c, r in enumerate(roles) if r is Role.ROLLOUT] or [0]
        with self.lock:
            runs = [0] * len(roles)
            for i in range(len(self.running)):
                runs[rollout[i % len(rollout)]] += 1
            self.server.post(RunsChanged(runs=tuple(runs), ended=self.ended))


@dataclass
class ScriptedCell:
    link: CellLink
    harness: Harness
    to_train_s: float = 2.0
    to_rollout_s: float = 1.0
    opt_s: float = 2.0
    silent_from: float | None = None      # stops acting at this time (a hung process)
    answers_shutdown: bool = True
    role: Role | None = None
    welcome: Welcome | None = None
    switch: tuple[SwitchTo, float] | None = None
    busy_until: float = 0.0
    version: int = 0
    step_groups: int = 0
    burst_steps: int = 0
    optimizing: bool = False
    orders: list = field(default_factory=list)
    said_hello: bool = False

    @property
    def cell(self) -> int:
        return self.link.cell

    def act(self, now: float) -> None:
        if self.link.closed or (self.silent_from is not None and now >= self.silent_from):
            return
        if not self.said_hello:
            self.said_hello = True
            self.link.send(Hello(cell=self.cell, rank=self.cell + 1, node=f"n{self.cell + 1}", pid=os.getpid()))
        while (order := self.link.next_order(0)) is not None:
            self.orders.append((now, order))
            if isinstance(order, Welcome):
                self.welcome, self.role = order, order.role
            elif isinstance(order, SwitchTo):
                dur = self.to_train_s if order.role is Role.TRAIN else self.to_rollout_s
                self.switch = (order, now + dur)
            elif isinstance(order, Shutdown):
                if self.answers_shutdown:
                    self.link.bye()
                return
        if self.switch and now >= self.switch[1]:
            order = self.switch[0]
            self.role, self.switch = order.role, None
            self.burst_steps = 0
            key = "drain_s" if order.role is Role.TRAIN else "engine_start_s"
            self.link.send(SwitchDone(cell=self.cell, role=order.role, order=order.order,
                                      timing={key: 0.5, "engine_stop_s": 0.25}))
        if self.role is Role.TRAIN and self.welcome and self.welcome.core == self.cell and not self.switch:
            self._train(now)
        self.link.beat()

    def _train(self, now: float) -> None:
        w, b = self.welcome, self.harness.server.policy.cfg.batch_groups
        if now < self.busy_until:
            return
        if self.optimizing:
            self.optimizing, self.step_groups = False, 0
            self.version += 1
            self.burst_steps += 1
            self.link.send(TrainProgress(cell=self.cell, version=self.version, mean_lag=0.5))
            return
        if w.mu is not None and self.burst_steps >= w.mu:
            return
        if self.step_groups == b:
            self.optimizing, self.busy_until = True, now + self.opt_s
            self.link.send(TrainProgress(cell=self.cell, version=self.version, optimizing=True))
            return
        if not w.streaming and self.step_groups == 0 and self.harness.ready < b:
            return
        if self.harness.take(1):
            self.step_groups += 1
            self.busy_until = now + self.harness.group_s
            self.link.send(TrainProgress(cell=self.cell, version=self.version, groups=1,
                                         work_s=self.harness.group_s))


class World:
    """K scripted cells, a harness and the real server on one in-process transport."""

    def __init__(self, tmp_path, policy_name: str = "gyre", cells: int = 3, sched: SchedulerConfig = SCHED,
                 alloc: AllocatorConfig = ALLOC, clock=None, run_s: float = 5.0, **cell_kw):
        from gyre_hpc.clock import ManualClock

        self.clock = clock or ManualClock()
        self.net = InProcessWorld(cells + 1)
        self.policy = Recording(make_policy(policy_name, sched, cells))
        self.harness = Harness(run_s=run_s)
        self.log_path = tmp_path / "events.jsonl"
        self.server = AllocatorServer(self.policy, alloc, self.net.endpoint(0, self.clock),
                                      EventLog(self.log_path, self.clock), self.harness.admit, runs_per_query=1)
        self.harness.server = self.server
        self.cells = [ScriptedCell(CellLink(self.net.endpoint(c + 1, self.clock), c, alloc.heartbeat_interval_s),
                                   self.harness, **cell_kw) for c in range(cells)]

    def act(self, now: float) -> None:
        self.harness.act(now)
        for cell in self.cells:
            cell.act(now)

    def attach(self) -> World:
        self.clock.on_sleep.append(self.act)
        return self

    def orders_of(self, cell: int, kind: type) -> list:
        return [o for _, o in self.cells[cell].orders if isinstance(o, kind)]

    def events(self, kind: str | None = None, **match) -> list[dict]:
        from gyre_hpc.allocator.eventlog import read_events

        return [r for r in read_events(self.log_path) if (kind is None or r["event"] == kind)
                and all(r.get(k) == v for k, v in match.items())]
