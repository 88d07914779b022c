"""The simulator's building blocks: event order, ready-time bookkeeping, lag accounting, capacity, determinism."""
import json

import pytest

from gyre_hpc.allocator.capacity import CapacityModel, capacity_from_curve, speed_factor
from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.allocator.sim.events import EventQueue
from gyre_hpc.allocator.staleness import LagLedger, admission_window
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import load_config
from gyre_hpc.errors import SchedulingError


def test_events_pop_in_time_order_and_ties_in_push_order():
    q = EventQueue()
    for kind, t in enumerate([5.0, 1.0, 5.0, 1.0, 3.0]):
        q.push(t, kind)
    popped = [(q.pop()[0], q.now) for _ in range(5)]
    assert [t for t, _ in popped] == [1.0, 1.0, 3.0, 5.0, 5.0]
    q2 = EventQueue()
    for kind in (4, 2, 7):
        q2.push(2.0, kind)
    assert [q2.pop()[2] for _ in range(3)] == [4, 2, 7]  # same time: sequence number decides


def test_event_in_the_past_is_rejected():
    q = EventQueue()
    q.push(10.0, 0)
    q.pop()
    with pytest.raises(SchedulingError, match="before now"):
        q.push(9.0, 0)


def test_ready_since_tracks_continuous_threshold_crossings():
    st = SchedState(cells=[CellState()])
    st.set_ready(3, 10.0)
    st.set_ready(6, 20.0)
    assert st.ready_since(3) == 10.0 and st.ready_since(5) == 20.0 and st.ready_since(7) is None
    st.set_ready(4, 30.0)  # a batch was consumed: >= 5 was interrupted, >= 4 and >= 3 were not
    assert st.ready_since(3) == 10.0 and st.ready_since(4) == 20.0 and st.ready_since(5) is None
    st.set_ready(8, 40.0)
    assert st.ready_since(5) == 40.0 and st.ready_since(4) == 20.0
    st.set_ready(0, 50.0)
    assert st.ready_since(1) is None and st.ready_since(0) == 0.0


def test_lag_is_training_version_minus_generating_version_per_token():
    ledger = LagLedger()
    mean, tokens = ledger.add_run(3, [1, 2, 3], [100.0, 100.0, 200.0])  # lags 2, 1, 0
    assert tokens == 400.0 and mean == pytest.approx((200 + 100) / 400)
    ledger.add_run(3, [3], [400.0])
    stats = ledger.stats()
    assert stats["staleness_mean"] == pytest.approx(300 / 800)  # per token
    assert stats["staleness_sample_mean"] == pytest.approx((0.75 + 0.0) / 2)  # per run
    assert stats["staleness_max"] == 2 and stats["staleness_p50"] == 0 and stats["staleness_p99"] == 2


def test_lag_bound_masks_older_tokens():
    ledger = LagLedger(max_staleness=1)
    ledger.add_run(5, [2, 4, 5], [10.0, 10.0, 20.0])
    stats = ledger.stats()
    assert stats["staleness_max"] == 1 and stats["masked_token_frac"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="negative lag"):
        ledger.add_run(1, [2], [1.0])


def test_admission_window_integrates_the_lag_error():
    st = SchedState(cells=[CellState()])
    assert admission_window(st, 10, 1.0, 0.5, 100) == 30
    st.record_batch_lag(3.0)  # one batch two versions too stale
    assert admission_window(st, 10, 1.0, 0.5, 100) == 20
    for _ in range(20):
        st.record_batch_lag(5.0)
    assert admission_window(st, 10, 1.0, 0.5, 100) == 10  # never below one batch
    st.lag_sum = -1e6
    assert admission_window(st, 10, 1.0, 0.5, 100) == 100  # never above the cap


def test_capacity_model_and_speed_curve():
    st = SchedState(cells=[CellState(role=Role.ROLLOUT, runs=5), CellState(role=Role.ROLLOUT, runs=5),
                           CellState(role=Role.TRAIN)], unfinished_runs=10)
    assert CapacityModel(10).can_release(st, 0)
    st.unfinished_runs = 11
    assert not CapacityModel(10).can_release(st, 0)
    assert speed_factor(0, 64, 0.5) == 1.0
    assert speed_factor(64, 64, 0.0) == pytest.approx(0.5)  # engine speed halves at half_load
    assert speed_factor(64, 64, 0.5) == pytest.approx(1 / 1.5)  # tool time does not stretch
    assert capacity_from_curve(64, 0.5, 1000) == 64 and capacity_from_curve(64, 0.5, 32) == 32


def _strip_timing(result):
    for r in result["policies"].values():
        for k in ("sim_seconds", "events_per_s"):
            r.pop(k, None)
    return json.dumps(result, sort_keys=True)


def test_same_seed_gives_identical_results_and_another_seed_differs():
    a, _ = compare(load_config("configs/sim/small.yaml", ["sim.policies=[gyre,colocate]"]))
    b, _ = compare(load_config("configs/sim/small.yaml", ["sim.policies=[gyre,colocate]"]))
    c, _ = compare(load_config("configs/sim/small.yaml", ["sim.policies=[gyre,colocate]", "run.seed=1"]))
    assert _strip_timing(a) == _strip_timing(b)
    assert _strip_timing(a) != _strip_timing(c)


def test_all_policies_see_the_same_workload_and_speedups_are_ratios():
    result, sims = compare(load_config("configs/sim/small.yaml", ["sim.policies=[gyre,async]"]))
    assert sims["gyre"].wl is sims["async"].wl
    p = result["policies"]
    assert result["speedups"]["gyre_vs_async"] == pytest.approx(p["async"]["hours"] / p["gyre"]["hours"])
    for r in p.values():
        for key in ("train_idle_frac", "rollout_idle_frac", "switch_frac"):
            assert 0.0 <= r[key] <= 1.0
        assert r["train_cell_frac"] + r["rollout_cell_frac"] + r["switch_frac"] == pytest.approx(1.0)


def test_orders_are_immutable_and_transition_roles_are_the_two_switches():
    from dataclasses import FrozenInstanceError

    from gyre_hpc.allocator.types import Admit, Switch

    with pytest.raises(FrozenInstanceError):
        Switch(0, Role.TRAIN).cell = 1
    with pytest.raises(FrozenInstanceError):
        Admit(3).queries = 4
    assert {r for r in Role if r.transition} == {Role.DRAINING, Role.LOADING}


def test_burst_steps_restart_when_training_cells_go_from_none_to_some():
    st = SchedState(cells=[CellState(), CellState()])
    st.set_role(0, Role.TRAIN, 1.0)
    st.burst_steps = 3
    st.set_role(1, Role.TRAIN, 2.0)  # a satellite joins the ongoing burst
    assert st.burst_steps == 3
    st.set_role(0, Role.ROLLOUT, 3.0)
    st.set_role(1, Role.ROLLOUT, 3.0)
    st.set_role(1, Role.TRAIN, 4.0)  # a new burst
    assert st.burst_steps == 0
