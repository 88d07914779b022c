"""The live staleness sweep's table and the replay benchmark's error distribution (issue 13): a ratio between
policies whose measured E[d] differ by more than 10% is marked, and the replay reports per-policy quantiles."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_sim_replay import _q, distribution  # noqa: E402
from benchmarks.live_staleness_sweep import table  # noqa: E402


def _rec(policy, target, step_s, ed):
    return {"policy": policy, "target": target, "rep": 1, "step_s": step_s, "staleness_mean": ed,
            "reward_last": 0.4, "error": None}


def test_sweep_table_marks_unmatched_and_off_target_ratios():
    data = {"steps": 3, "targets": [0.5, 1.0], "policies": ["gyre", "colocate"],
            "records": [_rec("gyre", 0.5, 10.0, 0.5), _rec("colocate", 0.5, 20.0, 0.3),
                        _rec("gyre", 1.0, 10.0, 1.3), _rec("colocate", 1.0, 15.0, 1.25)]}
    rows = table(data)[2:]
    assert rows[0].endswith("| 2.00 (not comparable) |")
    assert rows[1].endswith("| 1.50 (off target) |")  # matched with each other, but 30% above the target


def test_sweep_table_leaves_a_failed_run_out():
    data = {"steps": 3, "targets": [0.5], "policies": ["gyre", "async"],
            "records": [_rec("gyre", 0.5, 10.0, 0.5), {**_rec("async", 0.5, None, None), "error": "exit 1"}]}
    assert table(data)[2].endswith("| – |")


def test_replay_distribution_reports_signed_median_and_abs_quantiles_per_policy():
    runs = [{"policy": "gyre", "sim_error_pct": e, "sim_span_error_pct": 2 * e} for e in (-10.0, 2.0, 4.0)]
    runs.append({"policy": "async", "sim_error_pct": 1.0, "sim_span_error_pct": -3.0})
    lines = distribution(runs)
    by_name = {line.split("|")[1].strip(): line for line in lines[2:]}
    assert set(by_name) == {"all", "async", "gyre"}
    assert "| 3 | +2.0% | 4.0 / 8.8 / 10.0% | +4.0% | 8.0 / 17.6 / 20.0% |" in by_name["gyre"]
    assert _q([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
