"""gyre_hpc/report/compare.py: the invariants stated in its docstring, on small readable run records."""
import json

from gyre_hpc.report import compare


def test_speedups_are_the_median_of_per_repetition_ratios():
    walls = {"gyre": [10.0, 20.0, 40.0], "colocate": [15.0, 22.0, 100.0], "async": [10.0, 10.0, 10.0]}
    got = compare.speedups(walls, "gyre")
    assert got["colocate"] == 1.5       # ratios 1.5, 1.1, 2.5
    assert got["async"] == 0.5          # ratios 1.0, 0.5, 0.25
    assert "gyre" not in got


def test_speedups_leave_out_a_repetition_where_either_run_failed():
    walls = {"gyre": [10.0, None, 10.0], "colocate": [30.0, 11.0, None]}
    assert compare.speedups(walls, "gyre") == {"colocate": 3.0}
    assert compare.speedups({"gyre": [None], "async": [5.0]}, "gyre") == {"async": None}


def test_switch_breakdown_keeps_directions_apart_and_medians_only_present_parts():
    cells = [
        {"switches": [{"to": "train", "drain_s": 0.1, "engine_stop_s": 0.2, "total_s": 0.3},
                      {"to": "rollout", "engine_start_s": 5.0, "register_s": 0.1, "total_s": 5.1}]},
        {"switches": [{"to": "train", "drain_s": 0.3, "engine_stop_s": 0.4, "weight_pull_s": 0.05,
                       "total_s": 0.75},
                      {"to": "train", "drain_s": 0.5, "engine_stop_s": 0.6, "weight_pull_s": 0.07,
                       "trainer_init_s": 6.0, "total_s": 7.2},
                      {"to": "rollout", "engine_start_s": 9.0, "register_s": 0.3, "total_s": 9.3}]},
    ]
    b = compare.switch_breakdown(cells)
    assert b["r2t"]["n"] == 3 and b["t2r"]["n"] == 2
    assert b["r2t"]["drain_s"] == 0.3 and b["r2t"]["total_s"] == 0.75
    assert abs(b["r2t"]["weight_pull_s"] - 0.06) < 1e-12       # median of the two switches that pulled, not of three
    assert b["r2t"]["trainer_init_s"] == 6.0
    assert b["t2r"]["engine_start_s"] == 7.0 and b["t2r"]["register_s"] == 0.2
    assert compare.switch_breakdown([])["r2t"] == {"n": 0, **{p: None for p in compare.R2T_PARTS}}


def test_pull_throughput_is_bytes_over_wire_seconds():
    pulls = [{"bytes": 2_000_000, "seconds": 0.002, "checksum_ok": True},
             {"bytes": 2_000_000, "seconds": 0.004, "checksum_ok": True},
             {"bytes": 2_000_000, "seconds": 0.001, "checksum_ok": False}]
    got = compare.pull_throughput(pulls)
    assert got["n"] == 3 and got["bytes"] == 2_000_000
    assert got["gb_per_s"] == 1.0                   # 0.5, 1.0 and 2.0 GB/s
    assert got["checksum_ok"] is False
    assert compare.pull_throughput([])["checksum_ok"] is False


def test_run_directory_readers(tmp_path):
    (tmp_path / "cells").mkdir()
    for c in (1, 0):
        (tmp_path / "cells" / f"cell{c}.json").write_text(json.dumps({"cell": c, "switches": [], "pulls": [
            {"bytes": 10, "seconds": 1.0, "checksum_ok": True}] * c}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"version": 2, "reward": 0.5}, {"version": 1, "reward": 0.25}, {"version": 3, "reward": None})) + "\n")
    cells = compare.read_cells(tmp_path)
    assert [c["cell"] for c in cells] == [0, 1]
    assert len(compare.pulls(cells)) == 1
    assert compare.reward_curve(tmp_path) == [0.25, 0.5, None]
    assert compare.reward_curve(tmp_path / "missing") == []


def test_plot_rewards_writes_one_png_with_a_panel_per_policy(tmp_path):
    out = compare.plot_rewards({"gyre": [[0.3, 0.4], [0.35, None]], "async": [[]]}, tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_is_invalid_only_if_it_lost_a_cell_or_an_engine_died():
    ok = {"stop": {"lost": []}, "runs_finished": 16, "run_statuses": {"scored": 4, "timeout_partial": 12},
          "engine_deaths": 0}
    assert compare.invalid_reason(ok) is None  # timeouts are the policy's own outcome
    assert "cells lost" in compare.invalid_reason({**ok, "stop": {"lost": [2]}})
    assert "1 engine death" in compare.invalid_reason({**ok, "engine_deaths": 1})
    assert compare.invalid_reason({"stop": {}, "runs_finished": 0, "run_statuses": {}}) is None


def test_the_timed_out_share_counts_every_timeout_status():
    s = {"run_statuses": {"scored": 5, "timeout_partial": 2, "timeout_unscored": 1, "eval_failure": 2}}
    assert compare.timed_out_share(s) == 0.3
    assert compare.timed_out_share({"run_statuses": {}}) is None
