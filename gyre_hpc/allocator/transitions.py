"""The state changes every executor makes, written once: the simulator and the live allocator both call these.

A policy reads ``SchedState``; an executor (``sim.simulator.Simulation`` in virtual time, ``live.LiveExecutor``
from cell messages) writes it. The bookkeeping of a fact — a group became ready, an optimizer step finished,
a switch began or ended, a cell was lost — is the same whoever observed it, so it lives here.

Invariants (tests/unit/test_allocator_live.py)
- ``begin_switch`` allows exactly ROLLOUT→TRAIN (the cell becomes DRAINING) and TRAIN→ROLLOUT (LOADING);
  anything else, including any order to a LOST cell, is a ``SchedulingError`` naming the cell and roles.
- ``finish_switch`` allows exactly DRAINING→TRAIN and LOADING→ROLLOUT.
- ``step_done`` advances version, steps_done and burst_steps by one, consumes one batch of ready groups,
  clears ``optimizing`` and feeds the batch's lag to the staleness window.
- ``lose_cell`` never loses a run: the lost cell's unfinished runs become parked (``unfinished_runs`` is
  unchanged) for the rollout side to re-place on the remaining engines.
"""
from __future__ import annotations

from gyre_hpc.allocator.state import SchedState
from gyre_hpc.allocator.types import Role, Switch
from gyre_hpc.errors import SchedulingError

_BEGIN = {(Role.ROLLOUT, Role.TRAIN): Role.DRAINING, (Role.TRAIN, Role.ROLLOUT): Role.LOADING}
_FINISH = {Role.DRAINING: Role.TRAIN, Role.LOADING: Role.ROLLOUT}


def begin_switch(state: SchedState, order: Switch, now: float) -> Role:
    """Start the transition ``order`` asks for; returns the transition role the cell is now in."""
    if not 0 <= order.cell < len(state.cells):
        raise SchedulingError(f"switch of cell {order.cell}: there are {len(state.cells)} cells")
    role = state.cells[order.cell].role
    transition = _BEGIN.get((role, order.target))
    if transition is None:
        raise SchedulingError(f"cannot switch cell {order.cell} from {role.value} to {order.target.value}")
    state.set_role(order.cell, transition, now)
    return transition


def finish_switch(state: SchedState, cell: int, now: float) -> Role:
    """End the transition cell ``cell`` is in; returns its new role."""
    role = state.cells[cell].role
    if role not in _FINISH:
        raise SchedulingError(f"cell {cell} finished a switch but is {role.value}, not in a transition")
    state.set_role(cell, _FINISH[role], now)
    return _FINISH[role]


def admit(state: SchedState, groups: int, runs: int) -> None:
    """``groups`` new queries with ``runs`` runs in all were started."""
    state.admitted_queries += groups
    state.inflight_groups += groups
    state.unfinished_runs += runs


def groups_ready(state: SchedState, groups: int, work_s: float, now: float) -> None:
    """``groups`` in-flight groups had all their runs end; ``work_s`` cell-seconds of training were added."""
    if groups > state.inflight_groups:
        raise SchedulingError(f"{groups} groups became ready but only {state.inflight_groups} are in flight")
    state.inflight_groups -= groups
    state.unprocessed_groups += groups
    state.backlog_work_s += work_s
    state.set_ready(state.ready_groups + groups, now)


def groups_trained(state: SchedState, groups: int, work_s: float) -> None:
    """The training side processed ``groups`` ready groups (``work_s`` cell-seconds of the backlog)."""
    if groups > state.unprocessed_groups:
        raise SchedulingError(f"{groups} groups trained but only {state.unprocessed_groups} were waiting")
    state.unprocessed_groups -= groups
    state.step_groups += groups
    state.backlog_work_s = max(0.0, state.backlog_work_s - work_s)


def step_done(state: SchedState, batch_groups: int, mean_lag: float, now: float, lag_tokens: float = 0.0) -> None:
    """An optimizer step over ``batch_groups`` groups finished; ``mean_lag`` is the batch's mean token lag over
    its ``lag_tokens`` trained tokens."""
    if state.ready_groups < batch_groups:
        raise SchedulingError(f"an optimizer step needs {batch_groups} ready groups, {state.ready_groups} are")
    state.optimizing = False
    onpolicy = state.version == 0  # trained from version 0: no token can be older, its lag is 0
    state.version += 1
    state.steps_done += 1
    state.burst_steps += 1
    state.step_groups = max(0, state.step_groups - batch_groups)
    state.record_batch_lag(mean_lag, lag_tokens, onpolicy)
    state.set_ready(state.ready_groups - batch_groups, now)


def lose_cell(state: SchedState, cell: int, now: float) -> int:
    """Mark ``cell`` LOST; its runs become parked. Returns how many runs were re-homed that way."""
    runs = state.cells[cell].runs
    state.cells[cell].runs = 0
    state.parked_runs += runs
    state.set_role(cell, Role.LOST, now)
    return runs
