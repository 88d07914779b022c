"""Comparisons at matched staleness: each policy's measured E[d] beside its ratio; rows whose E[d] differ by
more than 10% are marked "not comparable"; ``live_policies.py --json`` prints the per-policy summary."""
import sys
from pathlib import Path

import pytest

from gyre_hpc.allocator.staleness import comparable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.live_policies_report import json_summary, matched, wall_table  # noqa: E402


def _rec(policy, rep, step_s, d, reward):
    return {"policy": policy, "rep": rep, "step_s": step_s, "run_wall_s": step_s + 5.0,
            "summary": {"staleness_mean": d, "reward_last": reward, "run_statuses": {"ok": 8}}}


DATA = {"policies": ["gyre", "colocate", "async"], "steps": 8, "reps": 2, "records": [
    _rec("gyre", 1, 30.0, 1.50, 0.40), _rec("gyre", 2, 32.0, 1.54, 0.42),
    _rec("colocate", 1, 60.0, 1.45, 0.41), _rec("colocate", 2, 62.0, 1.43, 0.39),
    _rec("async", 1, 50.0, 0.74, 0.38), _rec("async", 2, 52.0, 0.73, 0.37)]}


def test_comparable_is_symmetric_and_relative_to_the_larger_value():
    assert comparable(1.0, 1.1) and comparable(1.1, 1.0)
    assert not comparable(1.0, 1.2) and not comparable(1.52, 0.74)
    assert comparable(0.0, 0.0)


def test_a_ratio_between_policies_at_different_staleness_is_marked_not_comparable():
    assert matched(DATA) == {"gyre": True, "colocate": True, "async": False}
    rows = {line.split("|")[1].strip(): line for line in wall_table(DATA)[2:]}
    assert "1.52" in rows["gyre"] and "**not comparable**" in rows["async"] and "| 0.73 |" in rows["async"]
    assert "**not comparable**" not in rows["colocate"] and "| yes |" in rows["colocate"]


def test_json_summary_has_the_four_keys_per_policy():
    out = json_summary(DATA, 1.5)
    assert set(out) == {"policies"} and set(out["policies"]) == {"gyre", "colocate", "async"}
    assert out["policies"]["gyre"] == pytest.approx({"wall_s": 31.0, "staleness_mean": 1.52,
                                                     "staleness_target": 1.5, "reward_last": 0.41})


def test_the_live_benchmark_applies_a_tune_overlay_to_every_policy_alike(tmp_path):
    from benchmarks.live_policies import parse_args, train_cmd

    overlay = tmp_path / "tuned.yaml"
    overlay.write_text("scheduler: {theta: 0.75, mu: 2}\n")
    args = parse_args(["--overlay", str(overlay), "--set", "scheduler.mu=3", "--out", str(tmp_path / "o")])
    assert args.set == ["scheduler.theta=0.75", "scheduler.mu=2", "scheduler.mu=3"]
    for policy in ("gyre", "colocate", "async"):
        cmd = train_cmd(args, policy, 0)
        assert "scheduler.theta=0.75" in cmd and cmd.index("scheduler.mu=2") < cmd.index("scheduler.mu=3")
