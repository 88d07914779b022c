"""Every policy admits work so that its measured mean staleness E[d] holds the target (issue 13, part 1).

A policy may be fresher than the target only where it cannot go staler: its rollout side is saturated, so a
larger admission window adds queued runs, not generation ahead of training (then doubling the target leaves
E[d] where it is). It is never staler than the target + 10%.
"""
import functools

import pytest

from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.allocator.staleness import admission_window, token_lags
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.config import POLICY_NAMES, SchedulerConfig, load_config
from gyre_hpc.errors import ConfigError

WORKLOADS = ("configs/sim/small.yaml", "configs/sim/paper_2p4t.yaml", "configs/sim/paper_2p4t_spread.yaml")


@functools.lru_cache(maxsize=None)
def measured(config, name, target):
    result, _ = compare(load_config(config, [f"sim.policies=[{name}]", f"scheduler.staleness_target={target}"]))
    return result["policies"][name]["staleness_mean"]


@pytest.mark.slow
@pytest.mark.parametrize("config", WORKLOADS)
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_holds_the_target_staleness_within_ten_percent(config, name):
    target = load_config(config).scheduler.staleness_target
    d = measured(config, name, target)
    assert d <= 1.1 * target, f"{name} is staler than the target: E[d] {d:.2f} > 1.1 x {target}"
    if d < 0.9 * target:  # allowed only where more staleness cannot be used
        assert measured(config, name, 2 * target) <= 1.05 * d, (
            f"{name} is held below the target ({d:.2f} < 0.9 x {target}) although it could go staler")


def test_gyre_no_longer_overshoots_the_target_on_the_short_workload():
    # with the fixed-batch prior (B * (1 + 2 * target)) gyre measured 1.19 at target 1.0 here
    assert measured(WORKLOADS[0], "gyre", 1.0) <= 1.1
    assert 1.35 <= measured(WORKLOADS[0], "gyre", 1.5) <= 1.65


def test_staleness_max_caps_the_mean_by_closing_the_window():
    st = SchedState(cells=[CellState()], trained_batches=4, lag_sum=8.0)  # measured mean 2.0
    assert admission_window(st, 8, 1.0, 0.0, 64, prior=2.0) == 24
    assert admission_window(st, 8, 1.0, 0.0, 64, prior=2.0, cap=2.0) == 8  # at the cap: one batch only
    assert admission_window(st, 8, 1.0, 0.0, 64, prior=2.0, cap=2.5) == 24


def test_staleness_max_below_the_target_is_rejected():
    with pytest.raises(ConfigError, match="scheduler.staleness_max: must be >= staleness_target"):
        load_config(None, ["scheduler.staleness_target=1.5", "scheduler.staleness_max=1.0"])


def test_staleness_max_lowers_the_simulated_mean():
    free = measured(WORKLOADS[0], "gyre", 1.5)
    result, _ = compare(load_config(WORKLOADS[0], ["sim.policies=[gyre]", "scheduler.staleness_target=1.5",
                                                   "scheduler.staleness_max=1.5"]))
    assert result["policies"]["gyre"]["staleness_mean"] <= free


def test_streaming_policies_start_from_a_narrower_window_than_fixed_batches():
    cfg = SchedulerConfig(batch_groups=8, staleness_target=1.0)
    st = SchedState(cells=[CellState() for _ in range(4)])
    assert make_policy("gyre", cfg, 4).window(st) == 20
    assert make_policy("colocate", cfg, 4).window(st) == 24


def test_token_lags_is_the_per_token_definition():
    assert token_lags(3, [1, 2, 3]) == (3.0, 3.0, 2)
    assert token_lags(3, [1, 3], [10.0, 30.0]) == (20.0, 40.0, 2)
    with pytest.raises(ValueError, match="negative lag"):
        token_lags(1, [2])
