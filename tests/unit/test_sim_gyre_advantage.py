"""The gyre-advantage study's workload knobs and its decomposition (issue 13, benchmarks/sim_gyre_advantage.py):
a seed reorders the same queries, the tail knob changes only the spread of run durations, and the three factors
of the decomposition multiply to the ratio of the spans."""
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.sim_gyre_advantage import BASE, POLICIES, Point, decompose, permute, simulate, tail  # noqa: E402
from gyre_hpc.allocator.sim.workload import SimWorkload  # noqa: E402

TRACE = "tests/unit/data/live_genbound_load/gyre-t1"


def _wl():
    work = np.array([1.0, 2.0, 4.0, math.inf, 8.0, 0.5])
    return SimWorkload(work, np.full(6, 10.0), np.full(6, math.inf), np.array([0, 2, 4, 6]), 0.5)


def test_seed_zero_is_the_trace_order_and_other_seeds_reorder_whole_queries():
    wl = _wl()
    assert permute(wl, 0) is wl
    p = permute(wl, 3)
    groups = {tuple(p.work_s[p.offsets[q]:p.offsets[q + 1]]) for q in range(p.queries)}
    assert groups == {tuple(wl.work_s[wl.offsets[q]:wl.offsets[q + 1]]) for q in range(wl.queries)}


def test_tail_knob_keeps_mean_work_and_tokens_and_widens_the_spread():
    wl = _wl()
    fin = np.isfinite(wl.work_s)
    tokens = wl.work_s[fin] * wl.tok_per_work_s[fin]
    for k in (0.5, 2.0):
        t = tail(wl, k)
        assert np.isinf(t.work_s[~fin]).all()
        assert math.isclose(t.work_s[fin].mean(), wl.work_s[fin].mean())
        assert np.allclose(t.work_s[fin] * t.tok_per_work_s[fin], tokens)
    spread = [np.std(np.log(tail(wl, k).work_s[fin])) for k in (0.5, 1.0, 2.0)]
    assert spread[0] < spread[1] < spread[2]


def test_decomposition_multiplies_to_the_span_ratio_on_the_replayed_trace():
    p = Point(TRACE, [], 1.0, 4, BASE)
    r = {n: simulate(p.cfg, n, p.workload(0)) for n in POLICIES}
    for other in ("async", "colocate"):
        d = decompose(r["gyre"], r[other])
        assert math.isclose(d["work_per_step"] * d["in_flight"] * d["speed"],
                            r[other]["span_s"] / r["gyre"]["span_s"], rel_tol=1e-6)
