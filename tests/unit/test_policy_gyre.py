"""Gyre policy invariants: one transition at a time, capacity before release, core first and last, tau wait."""
import pytest

from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Admit, Role, Switch, WakeAt
from gyre_hpc.config import SchedulerConfig

CFG = SchedulerConfig(batch_groups=8, theta=0.5, tau_s=100.0, capacity_runs_per_cell=10, satellite_min_work_s=0.0)


def state(roles, runs=None, ready=0, ready_at=0.0, **kw):
    runs = runs or [0] * len(roles)
    st = SchedState(cells=[CellState(role=r, runs=n) for r, n in zip(roles, runs)], runs_per_query=2, **kw)
    st.unfinished_runs = sum(runs) + st.parked_runs
    st.set_ready(ready, ready_at)
    return st


def switches(orders):
    return [o for o in orders if isinstance(o, Switch)]


R, T = Role.ROLLOUT, Role.TRAIN


def test_core_moves_first_once_ready_for_tau():
    gyre = make_policy("gyre", CFG, 4)
    st = state([R, R, R, R], runs=[3, 3, 3, 3], ready=4, ready_at=50.0)
    assert switches(gyre.decide(st, 149.0)) == []
    assert WakeAt(150.0) in gyre.decide(st, 149.0)
    assert switches(gyre.decide(st, 150.0)) == [Switch(0, Role.TRAIN)]


def test_no_move_while_ready_groups_below_theta_batch():
    gyre = make_policy("gyre", CFG, 4)
    st = state([R, R, R, R], runs=[1, 1, 1, 1], ready=3, ready_at=0.0)
    assert switches(gyre.decide(st, 1e6)) == []


def test_never_leaves_rollout_when_others_cannot_absorb_its_runs():
    gyre = make_policy("gyre", CFG, 4)
    st = state([R, R, R, R], runs=[8, 8, 8, 8], ready=8)  # 32 unfinished > 3 cells x 10
    assert switches(gyre.decide(st, 1e6)) == []
    st = state([R, R, R, R], runs=[8, 8, 7, 7], ready=8)  # 30 fit in 3 cells
    assert switches(gyre.decide(st, 1e6)) == [Switch(0, Role.TRAIN)]


def test_no_order_while_a_cell_is_in_transition():
    gyre = make_policy("gyre", CFG, 4)
    for transition in (Role.DRAINING, Role.LOADING):
        st = state([T, transition, R, R], runs=[0, 0, 1, 1], ready=8, backlog_work_s=1e5, unprocessed_groups=8)
        assert switches(gyre.decide(st, 1e6)) == []


def test_satellite_joins_only_while_core_trains():
    gyre = make_policy("gyre", CFG, 4)
    st = state([R, R, R, R], runs=[0, 1, 1, 1], ready=8, core=0)
    assert switches(gyre.decide(st, 1e6)) == [Switch(0, Role.TRAIN)]  # the core, never a satellite
    st = state([T, R, R, R], runs=[0, 3, 1, 2], ready=8, backlog_work_s=1e5, unprocessed_groups=8)
    assert switches(gyre.decide(st, 1e6)) == [Switch(2, Role.TRAIN)]  # least-loaded satellite


def test_core_leaves_training_last():
    gyre = make_policy("gyre", CFG, 4)
    st = state([T, T, R, R], runs=[0, 0, 2, 2], ready=4, burst_steps=1)
    assert switches(gyre.decide(st, 1e6)) == [Switch(1, Role.ROLLOUT)]
    st = state([T, R, R, R], runs=[0, 2, 2, 2], ready=4, burst_steps=1)
    assert switches(gyre.decide(st, 1e6)) == [Switch(0, Role.ROLLOUT)]


def test_core_stays_while_optimizer_step_runs():
    gyre = make_policy("gyre", CFG, 4)
    st = state([T, R, R, R], runs=[0, 2, 2, 2], ready=4, burst_steps=1, optimizing=True)
    assert Switch(0, Role.ROLLOUT) not in gyre.decide(st, 1e6)


def test_satellite_returns_when_its_work_is_done():
    gyre = make_policy("gyre", CFG, 4)
    st = state([T, R, T, R], runs=[0, 2, 0, 2], ready=4, unprocessed_groups=0)
    assert switches(gyre.decide(st, 1e6)) == [Switch(2, Role.ROLLOUT)]


def test_lost_cell_is_never_ordered():
    gyre = make_policy("gyre", CFG, 3)
    st = state([Role.LOST, R, R], runs=[0, 1, 1], ready=8, core=1)
    orders = switches(gyre.decide(st, 1e6))
    assert orders == [Switch(1, Role.TRAIN)]


def test_admission_respects_window_and_capacity():
    gyre = make_policy("gyre", SchedulerConfig(batch_groups=8, capacity_runs_per_cell=100), 4)
    st = state([R, R, R, R])
    (admit,) = [o for o in gyre.decide(st, 0.0) if isinstance(o, Admit)]
    assert admit.queries == gyre.window(st) == 20  # B * (1 + 1.5 * E[d]) with no lag measured yet (streaming)
    st = state([R, R, R, R], runs=[99, 99, 99, 99])
    (admit,) = [o for o in gyre.decide(st, 0.0) if isinstance(o, Admit)]
    assert admit.queries == 2  # 4 free slots / 2 runs per query
    st = state([T, R, R, R], runs=[0, 100, 100, 100])
    assert not [o for o in gyre.decide(st, 0.0) if isinstance(o, Admit)]  # a training cell adds no room


@pytest.mark.parametrize("theta", [0.0, 1.5, -0.1])
def test_theta_outside_unit_interval_is_rejected(theta):
    from gyre_hpc.config import load_config
    from gyre_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match=r"scheduler\.theta: must be in \(0, 1\]"):
        load_config(None, [f"scheduler.theta={theta}"])
