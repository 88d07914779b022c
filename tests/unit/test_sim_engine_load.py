"""The engines' load in the simulator and in the replay of a live run (issue 13: async with one generating cell).

Live (benchmarks/results/live_staleness_sweep_12steps.md), async with 3 of 4 cells training rolls out on one engine
holding 34-50 runs and took 126.5 s to 12 steps, against 96.6 s with 2 generating cells. The replay of a gyre trace
took every duration as measured under gyre's light load and predicted async within 3% of gyre with either split.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gyre_hpc.allocator.capacity import engine_load, speed_factor
from gyre_hpc.allocator.sim.engine_load import Curve, LoadSeries, run_nominal
from gyre_hpc.allocator.sim.replay import calibrate, read_run, replay

GYRE_T1 = Path(__file__).parent / "data" / "live_genbound_load" / "gyre-t1"
LIVE_ASYNC_T1_SPAN_S = 64.0  # async-t1 of the same sweep (live_staleness_sweep_quiet.md), first admission -> 6th step


def _async_span(atc: int, steps: int) -> tuple[float, dict]:
    res, sims = replay(GYRE_T1, overrides=[f"sim.steps={steps}", "scheduler.staleness_target=1.0",
                                           "scheduler.staleness_gain=0.75", f"scheduler.async_train_cells={atc}"])
    return res["predicted"]["async"]["span_s"], res


def test_an_engine_with_more_runs_than_slots_shares_its_time_among_them():
    at_slots = speed_factor(32, 1.0, 0.0, slots=32)
    assert speed_factor(64, 1.0, 0.0, slots=32) == pytest.approx(at_slots / 2)
    assert speed_factor(16, 1.0, 0.0, slots=32) == pytest.approx(speed_factor(16, 1.0, 0.0))  # below: unchanged


def test_tool_waits_free_the_engine_when_only_calls_load_it():
    for load, tool in ((5, 0.8), (24, 0.78), (48, 0.78), (10, 0.0)):
        n = engine_load(load, 1.0, tool, slots=32)
        s = (1 + min(n, 32)) * max(1.0, n / 32)
        assert n == pytest.approx(load * (1 - tool) * s / (tool + (1 - tool) * s))  # the fixed point
        assert n <= load
    assert engine_load(10, 1.0, 0.0) == pytest.approx(10)
    assert speed_factor(24, 1.0, 0.78, 32, calls_only=True) > speed_factor(24, 1.0, 0.78, 32)


def test_nominal_work_takes_the_measured_load_out_of_a_duration():
    events = [{"event": "start", "wall": 0.0, "roles": ["rollout", "rollout"]},
              {"event": "runs", "wall": 0.0, "runs": [3, 3]},
              {"event": "order", "order": "switch", "wall": 10.0, "cell": 0, "target": "train"},
              {"event": "order", "order": "switch", "wall": 10.0, "cell": 1, "target": "train"},
              {"event": "switch_done", "wall": 12.0, "cell": 0, "role": "rollout"}]
    series = LoadSeries.from_events(events)
    curve = Curve(half_load=1.0, slots=32, tool_frac=0.5)
    w = curve.nominal(series, np.array([0.0, 0.0, 10.0]), np.array([10.0, 14.0, 12.0]))
    assert w[0] == pytest.approx(10.0 * curve.rate(3))          # constant load 3 for 10 s
    assert w[1] == pytest.approx(10.0 * curve.rate(3) + 2.0 * curve.rate(3))  # paused 10-12 s: no progress
    assert w[2] == 0.0
    assert Curve(1e12, math.inf, 0.0).nominal(series, np.array([0.0]), np.array([8.0]))[0] == pytest.approx(8.0)
    # a run of 9 s with two calls (0-2 s and 4-6 s at load 3: stretch 4): 5 s outside calls + 4 s / 4 of engine work
    work, tool = run_nominal(series, 1.0, 32, 9.0, np.array([[0.0, 2.0], [4.0, 6.0]]))
    assert (work, tool) == (pytest.approx(6.0), pytest.approx(5.0))


def test_a_replay_of_an_emulated_device_takes_the_engine_load_out_of_the_durations():
    cal = calibrate(read_run(GYRE_T1))
    load = cal.facts["engine_load"]
    assert load["half_load"] == 1.0 and load["slots"] == 32 and 0.5 < load["tool_frac"] < 0.95
    assert cal.sim["load_model"] == "calls" and cal.sim["engine_slots"] == 32
    finite = cal.workload.work_s[np.isfinite(cal.workload.work_s)]
    measured = [e for g in read_run(GYRE_T1).groups for e in g["end_s"]]
    assert finite.mean() < 0.6 * np.mean(measured)  # gyre's engines ran ~5 requests each: runs took >2x nominal


def test_async_with_one_generating_cell_is_slower_than_with_two_on_a_gyre_trace():
    one, res = _async_span(3, 12)
    two, _ = _async_span(2, 12)
    assert one >= 1.05 * two  # live: 126.5 s vs 96.6 s (1.31x); now 120.8 vs 111.7 (1.08x, under-predicted); before: 80.1 vs 80.3
    assert one >= 1.5 * res["predicted"]["gyre"]["span_s"]  # live 1.98x; now 1.70x; before: within 3% of gyre


def test_a_gyre_trace_predicts_the_measured_async_run_within_15_percent():
    span, _ = _async_span(3, 6)  # the live async run had async_train_cells 3, as the gyre run's config
    assert span == pytest.approx(LIVE_ASYNC_T1_SPAN_S, rel=0.15)  # before: 42.1 s (-34%)
