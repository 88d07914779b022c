"""The on-policy first batch does not wind up a streaming window (issue 13: gyre overshot its target live).

The first optimizer step trains from version 0, so its lag is 0 whatever was admitted. The window's integral
term counted it as a lag deficit of ``target`` and opened the window by ``gain * B * target`` before any
feedback could arrive; the extra groups were trained 2-4 steps later, when the integral had not yet seen them,
and a 6-step live gyre run ended 13-32% over its target (benchmarks/results/live_staleness_cause.md). A streaming window
now reads ``SchedState.feedback_lag``: the batches admission could have made staler. Fixed-batch policies keep
the on-policy batch in their feedback (their lags are a 0 / 1 / ... sawtooth of whole batches, whose first
tooth it is). The hard cap ``staleness_max`` still reads the reported E[d], every batch included.

The replay tests run the simulator on four live gyre runs of configs/bench/live_genbound.yaml (6 steps, the
runs of benchmarks/results/live_staleness_sweep_quiet.md, trimmed to the records the replay reads); the
simulator reproduced their measured E[d] within 0.04 (0.67 / 1.30 / 1.86 / 2.25 against 0.66 / 1.31 / 1.87 /
2.22), so the plant is the live one.
"""
from pathlib import Path

import pytest

from gyre_hpc.allocator import transitions as tr
from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.sim.replay import replay
from gyre_hpc.allocator.state import CellState, SchedState
from gyre_hpc.allocator.types import Role
from gyre_hpc.config import SchedulerConfig
from gyre_hpc.live.lost import sched_from_steps

B = 4
CFG = SchedulerConfig(batch_groups=B, staleness_target=2.0, staleness_gain=0.5)
TRACES = Path(__file__).parent / "data" / "live_genbound_gyre"
TARGETS = (0.5, 1.0, 1.5, 2.0)


def trained(steps, version=0) -> SchedState:
    """A state after optimizer steps of (mean lag, tokens), the first trained from ``version``."""
    st = SchedState(cells=[CellState(role=Role.TRAIN) for _ in range(4)], version=version)
    for lag, tokens in steps:
        tr.admit(st, B, B)
        tr.groups_ready(st, B, 0.0, now=0.0)
        tr.groups_trained(st, B, 0.0)
        tr.step_done(st, B, mean_lag=lag, now=1.0, lag_tokens=tokens)
    return st


def test_the_on_policy_first_batch_leaves_a_streaming_window_at_its_prior():
    gyre = make_policy("gyre", CFG, 4)
    prior = gyre.window(SchedState(cells=[CellState() for _ in range(4)]))
    assert prior == B * (1 + 1.5 * 2.0) == 16
    # before: 4 * (4 + 0.5 * 1 * (2 - 0)) = 20 groups, four more admitted at version 1 on no evidence
    assert gyre.window(trained([(0.0, 600.0)])) == prior


def test_the_streaming_feedback_reads_the_batches_after_the_first():
    gyre = make_policy("gyre", CFG, 4)
    st = trained([(0.0, 600.0), (2.0, 600.0)])
    assert st.feedback_lag == (1, 2.0) and st.measured_lag == 1.0
    assert gyre.window(st) == 16  # on target; before: 4 * (4 + 0.5 * 2 * (2 - 1)) = 20
    stale = trained([(0.0, 600.0), (3.0, 600.0)])
    assert gyre.window(stale) == round(B * (4 + 0.5 * 1 * (2 - 3))) == 14


def test_fixed_batch_policies_keep_the_on_policy_batch_in_their_feedback():
    colocate = make_policy("colocate", CFG, 4)
    st = trained([(0.0, 600.0)])
    assert colocate.window(st) == round(B * (1 + 2 * 2.0 + 0.5 * 1 * 2.0)) == 24


def test_the_cap_still_reads_the_reported_mean_with_the_first_batch():
    capped = make_policy("gyre", SchedulerConfig(batch_groups=B, staleness_target=2.0, staleness_max=2.0), 4)
    st = trained([(0.0, 600.0), (3.0, 600.0)])  # reported 1.5 < cap 2.0 though the fed-back batch is 3.0
    assert capped.window(st) > B


def test_a_resumed_runs_first_batch_is_not_on_policy():
    st = trained([(1.0, 500.0)], version=3)
    assert (st.onpolicy_batches, st.feedback_lag) == (0, (1, 1.0))


def test_counters_rebuilt_from_step_records_match_the_live_state():
    st = trained([(0.0, 600.0), (1.5, 400.0)])
    rebuilt = sched_from_steps([{"staleness_mean": 0.0, "lag_tokens": 600}, {"staleness_mean": 1.5, "lag_tokens": 400}],
                               {"admitted_queries": 8})
    assert (rebuilt["onpolicy_batches"], rebuilt["onpolicy_tokens"]) == (st.onpolicy_batches, st.onpolicy_tokens)


def replayed(trace: str, target: float) -> float:
    gain = SchedulerConfig().staleness_gain  # the default (the traces' config.yaml pins the 0.5 they ran with)
    result, _ = replay(TRACES / trace, what_if=False,
                       overrides=[f"scheduler.staleness_target={target}", f"scheduler.staleness_gain={gain}"])
    return result["predicted"]["gyre"]["staleness_mean"] / target - 1.0


@pytest.mark.slow
def test_gyre_on_the_live_workload_holds_the_target_in_six_steps():
    # 16 cells: 4 live traces x 4 targets. Before the fix: 1 of 16 within 10%, worst +38%, mean |error| 23%.
    # Now 14 of 16; the two outside are the trace of the target-0.5 run at targets 1 and 1.5 (+20%, +15%):
    # its early groups were long, and 6 steps leave the integral no time to correct them.
    errors = {(t, target): replayed(f"t{t:g}", target) for t in TARGETS for target in TARGETS}
    within = [k for k, e in errors.items() if abs(e) <= 0.1]
    assert len(within) >= 14, errors
    assert max(abs(e) for e in errors.values()) <= 0.21, errors
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.07, errors
