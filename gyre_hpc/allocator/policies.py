"""Scheduling policies: pure functions of ``(state, now)`` to a list of orders.

Every policy admits new queries through the same staleness window (``staleness.admission_window``, its prior
set by the policy's training order, so that each holds the same measured E[d]):
streaming policies also within the capacity of the cells that roll out, the others a whole fixed batch at a
time (the engines queue runs that do not fit). Each tells the trainer two facts: ``streaming`` (ready groups go to
updates in completion order and training starts on them before the batch is complete; otherwise a batch is
a fixed set of B queries, trained once all of them are done) and ``mu`` (optimizer steps per burst;
None = the training side never stops).

* **gyre** — all cells start rolling out. The core cell moves to training first, when (i) the other rollout
  cells can absorb every unfinished run and (ii) ready groups have stayed >= theta * B for tau_s seconds.
  Satellites follow one at a time under the same two conditions while the backlog per training cell
  exceeds ``satellite_min_work_s``; a satellite returns as soon as the backlog is empty, the core after
  ``mu`` optimizer steps and after every satellite has left.
* **colocate** — the whole pool rolls out until the next fixed batch is complete, then every cell trains
  it (generation is paused), then every cell returns. **colocate_streaming** forms batches in completion
  order: the pool switches once theta * B groups have been ready for tau_s and returns when the backlog is
  empty (gradients accumulate across bursts; the optimizer steps every B groups).
* **async** — a fixed pool of ``async_train_cells`` cells (the core first) starts in training, the rest
  roll out, forever (``initial_roles``); the trainer waits for complete batches. **async_streaming** trains ready groups as they come.

Invariants (tested in tests/unit/test_policy_*.py)
- gyre never orders a switch while a cell is in transition, and orders at most one switch per decision.
- gyre never moves a cell out of rollout unless the remaining rollout cells can absorb all unfinished runs.
- gyre moves the core first: no satellite trains unless the core trains (the optimizer state lives only on
  the core), and the core leaves training last.
- async never switches a cell after the pools are formed; colocate never trains while any cell rolls out.
- admitted-but-untrained groups never exceed the staleness window; a fixed-batch policy admits whole batches.
- a LOST cell is never given an order.
"""
from __future__ import annotations

from dataclasses import dataclass

from gyre_hpc.allocator.capacity import CapacityModel
from gyre_hpc.allocator.staleness import admission_window, prior_for
from gyre_hpc.allocator.state import SchedState
from gyre_hpc.allocator.types import Admit, Order, Role, Switch, WakeAt
from gyre_hpc.config import SchedulerConfig, check_policy_name
from gyre_hpc.errors import ConfigError


@dataclass(frozen=True)
class Policy:
    """Shared admission and helpers; subclasses implement ``_roles``."""

    cfg: SchedulerConfig
    name: str = "policy"
    streaming: bool = False
    mu: int | None = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity", CapacityModel(self.cfg.capacity_runs_per_cell))

    def decide(self, state: SchedState, now: float) -> list[Order]:
        orders = self._roles(state, now)
        orders.extend(self._admit(state, orders))
        return orders

    def _roles(self, state: SchedState, now: float) -> list[Order]:  # pragma: no cover - abstract
        raise NotImplementedError

    def initial_roles(self, n_cells: int, core: int = 0) -> list[Role]:
        """Roles the cells start in (every cell rolls out unless the policy fixes pools)."""
        return [Role.ROLLOUT] * n_cells

    def rollout_capable(self, state: SchedState) -> int:
        """Cells whose capacity admission may fill: those rolling out or about to."""
        n = 0
        for c in state.cells:
            if c.role is Role.ROLLOUT or c.role is Role.LOADING:
                n += 1
        return n

    def window(self, state: SchedState) -> int:
        b = self.cfg.batch_groups
        return admission_window(state, b, self.cfg.staleness_target, self.cfg.staleness_gain,
                                int(self.cfg.max_window_batches * b), prior_for(self.streaming),
                                self.cfg.staleness_max, self.streaming)

    def _admit(self, state: SchedState, orders: list[Order]) -> list[Order]:
        room_groups = self.window(state) - (state.inflight_groups + state.ready_groups)
        if room_groups <= 0:
            return []
        if not self.streaming:  # fixed batches are submitted whole; the engines queue what does not fit
            b = self.cfg.batch_groups
            n = room_groups // b * b
        else:
            room_runs = self.capacity.capacity(self.rollout_capable(state)) - state.unfinished_runs
            n = min(room_groups, room_runs // state.runs_per_query)
        return [Admit(n)] if n > 0 else []

    def _ripe(self, state: SchedState, now: float) -> tuple[bool, list[Order]]:
        """Condition (ii): ready >= theta * B for tau_s. Returns (ripe, a WakeAt if it ripens later)."""
        since = state.ready_since(self.cfg.theta * self.cfg.batch_groups)
        if since is None:
            return False, []
        ripe_at = since + self.cfg.tau_s
        if now >= ripe_at:
            return True, []
        return False, [WakeAt(ripe_at)]


@dataclass(frozen=True)
class Gyre(Policy):
    name: str = "gyre"
    streaming: bool = True

    def _roles(self, state: SchedState, now: float) -> list[Order]:
        if state.in_transition:
            return []
        cells, core = state.cells, state.core
        train = state.training_cells
        satellites = [c for c in train if c != core]
        if cells[core].role is Role.TRAIN:
            burst_done = state.burst_steps >= self.mu and not state.optimizing
            if satellites and (burst_done or state.unprocessed_groups == 0):
                return [Switch(satellites[-1], Role.ROLLOUT)]
            if burst_done:
                return [Switch(core, Role.ROLLOUT)]
            ripe, wake = self._ripe(state, now)
            per_cell = state.backlog_work_s / (len(train) + 1)
            if not ripe or per_cell < self.cfg.satellite_min_work_s:
                return wake
            return self._release(state, [i for i in state.cells_in(Role.ROLLOUT) if i != core])
        if cells[core].role is Role.ROLLOUT:
            ripe, wake = self._ripe(state, now)
            if ripe:
                return self._release(state, [core])
            return wake
        return []

    def _release(self, state: SchedState, candidates: list[int]) -> list[Order]:
        """Switch the least-loaded candidate to training if the others can absorb its runs."""
        for cell in sorted(candidates, key=lambda i: state.cells[i].runs):
            if self.capacity.can_release(state, cell):
                return [Switch(cell, Role.TRAIN)]
        return []


@dataclass(frozen=True)
class Colocate(Policy):
    name: str = "colocate"

    def _roles(self, state: SchedState, now: float) -> list[Order]:
        live = [i for i, c in enumerate(state.cells) if c.role is not Role.LOST]
        roles = {state.cells[i].role for i in live}
        if roles == {Role.ROLLOUT} and self._go(state, now):
            return [Switch(i, Role.TRAIN) for i in live]
        if roles == {Role.TRAIN} and self._done(state):
            return [Switch(i, Role.ROLLOUT) for i in live]
        return self._wake(state, now) if roles == {Role.ROLLOUT} else []

    def _go(self, state: SchedState, now: float) -> bool:
        return state.unprocessed_groups >= self.cfg.batch_groups

    def _wake(self, state: SchedState, now: float) -> list[Order]:
        return []

    def _done(self, state: SchedState) -> bool:
        return state.burst_steps >= self.mu and not state.optimizing


@dataclass(frozen=True)
class ColocateStreaming(Colocate):
    name: str = "colocate_streaming"
    streaming: bool = True

    def _go(self, state: SchedState, now: float) -> bool:
        return self._ripe(state, now)[0] and state.unprocessed_groups > 0

    def _wake(self, state: SchedState, now: float) -> list[Order]:
        return self._ripe(state, now)[1]

    def _done(self, state: SchedState) -> bool:
        return not state.optimizing and (state.burst_steps >= self.mu or state.unprocessed_groups == 0)


@dataclass(frozen=True)
class Async(Policy):
    name: str = "async"
    mu: int | None = None

    def initial_roles(self, n_cells: int, core: int = 0) -> list[Role]:
        pool = set(self.train_pool(n_cells, core))
        return [Role.TRAIN if i in pool else Role.ROLLOUT for i in range(n_cells)]

    def _roles(self, state: SchedState, now: float) -> list[Order]:
        return []  # the pools are fixed from the start

    def train_pool(self, n_cells: int, core: int = 0) -> list[int]:
        others = [i for i in range(n_cells) if i != core]
        return [core] + others[: self.cfg.async_train_cells - 1]


@dataclass(frozen=True)
class AsyncStreaming(Async):
    name: str = "async_streaming"
    streaming: bool = True


_CLASSES = {"gyre": Gyre, "colocate": Colocate, "colocate_streaming": ColocateStreaming, "async": Async,
            "async_streaming": AsyncStreaming}


def validate(name: str, cfg: SchedulerConfig, cells: int) -> None:
    """Cross-section checks a policy needs; errors name the dotted key."""
    check_policy_name(name)  # the name itself is config's to check (config.PolicyName)
    if name == "gyre" and cells < 2:
        raise ConfigError(f"cluster.cells: gyre needs at least 2 cells, got {cells}")
    if name.startswith("async") and not 1 <= cfg.async_train_cells <= cells - 1:
        raise ConfigError(
            f"scheduler.async_train_cells: {cfg.async_train_cells} of {cells} cells leaves "
            f"{'no rollout' if cfg.async_train_cells >= cells else 'no training'} pool")


def make_policy(name: str, cfg: SchedulerConfig, cells: int) -> Policy:
    """The policy ``name`` configured by ``cfg`` for ``cells`` cells (validated first)."""
    validate(name, cfg, cells)
    cls = _CLASSES[name]
    # async trains for the whole job (no bursts); colocate trains one fixed batch per switch
    mu = None if issubclass(cls, Async) else 1 if cls is Colocate else cfg.mu
    return cls(cfg, mu=mu)
