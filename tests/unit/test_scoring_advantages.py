"""Scoring and group advantages: eval failures excluded and counted, valid 0 trains, partial scores train."""
import numpy as np
import pytest

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.trajectory.advantages import group_advantages
from gyre_hpc.trajectory.pipeline import build_batch, plan
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog


def log_of(outcomes):
    """One single-call run per (run id, status, score); run ids are q<g>-r<i>."""
    calls = [Call.of(run, "c0", [1, 2, 3], [4 + i, 5]) for i, (run, _, _) in enumerate(outcomes)]
    outs = [Outcome(run, run.split("-")[0], RunStatus(status), score) for run, status, score in outcomes]
    return TitoLog(tuple(calls), tuple(outs))


def per_run(report):
    return {r.run_id: r for r in report.per_run}


def test_eval_failure_is_excluded_from_training_and_group_stats_and_counted():
    log = log_of([("q0-r0", "scored", 1.0), ("q0-r1", "scored", 0.0), ("q0-r2", "eval_failure", None)])
    rep = plan(log, TrajectoryConfig(advantage_norm="mean")).report
    runs = per_run(rep)
    assert rep.eval_failures == 1 and rep.runs_trained == 2
    assert runs["q0-r2"].trained is False and runs["q0-r2"].reason == "eval_failure"
    assert runs["q0-r2"].advantage is None
    assert runs["q0-r0"].advantage == pytest.approx(0.5) and runs["q0-r1"].advantage == pytest.approx(-0.5)
    # had the failure counted as a 0, the mean would be 1/3 and r0's advantage 2/3


def test_a_valid_zero_trains_with_a_negative_advantage():
    log = log_of([("q0-r0", "scored", 0.0), ("q0-r1", "scored", 0.5)])
    batch, rep = build_batch(log, TrajectoryConfig(advantage_norm="mean"), "flat")
    assert per_run(rep)["q0-r0"].trained and per_run(rep)["q0-r0"].advantage == pytest.approx(-0.25)
    row0 = batch.loss_mask[0] > 0
    assert row0.sum() == 2 and np.allclose(batch.advantage[0][row0], -0.25)


def test_timeout_partial_trains_with_its_partial_score_and_unscorable_runs_do_not():
    log = log_of([("q0-r0", "timeout_partial", 0.3), ("q0-r1", "scored", 0.9), ("q0-r2", "timeout_unscorable", None),
                  ("q0-r3", "aborted", None)])
    rep = plan(log, TrajectoryConfig(advantage_norm="mean")).report
    runs = per_run(rep)
    assert runs["q0-r0"].trained and runs["q0-r0"].score == 0.3
    assert runs["q0-r0"].advantage == pytest.approx(0.3 - 0.6)
    assert (rep.timeout_partial, rep.timeout_unscorable, rep.aborted) == (1, 1, 1)
    assert [runs[r].reason for r in ("q0-r2", "q0-r3")] == ["timeout_unscorable", "aborted"]


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_equal_score_groups_are_dropped_or_kept_with_zero_advantage(policy):
    log = log_of([("q0-r0", "scored", 1.0), ("q0-r1", "scored", 1.0), ("q0-r2", "eval_failure", None),
                  ("q1-r0", "scored", 1.0), ("q1-r1", "scored", 0.0)])
    batch, rep = build_batch(log, TrajectoryConfig(equal_score_groups=policy), "tree")
    runs = per_run(rep)
    assert rep.groups == 2 and rep.groups_dropped == (1 if policy == "drop" else 0)
    if policy == "drop":
        assert not runs["q0-r0"].trained and runs["q0-r0"].reason == "equal_scores"
        assert rep.runs_trained == 2
    else:
        assert runs["q0-r0"].trained and runs["q0-r0"].advantage == 0.0
        assert rep.runs_trained == 4
    assert batch.trained_tokens == rep.trained_tokens == 2 * rep.runs_trained


def test_mean_std_normalisation_and_zero_mean():
    scores = {"a": ("q", 1.0), "b": ("q", 0.0), "c": ("q", 0.5), "d": ("q", None)}
    adv, dropped = group_advantages(scores, "mean_std", 1e-6, "drop")
    s = np.array([1.0, 0.0, 0.5])
    assert set(adv) == {"a", "b", "c"} and dropped == []
    assert [adv[k] for k in "abc"] == pytest.approx(list((s - s.mean()) / (s.std() + 1e-6)))
    assert sum(adv.values()) == pytest.approx(0.0, abs=1e-12)


def test_a_group_of_one_scorable_run_has_no_signal():
    adv, dropped = group_advantages({"a": ("q", 0.7), "b": ("q", None)}, "mean", 1e-6, "drop")
    assert adv == {} and dropped == ["q"]
    adv, _ = group_advantages({"a": ("q", 0.7)}, "mean", 1e-6, "keep")
    assert adv == {"a": 0.0}


def test_an_in_memory_log_with_an_unfinished_run_is_an_error():
    from gyre_hpc.errors import TrajectoryError

    log = TitoLog((Call.of("q0-r0", "c0", [1], [2]), Call.of("q0-r1", "c0", [1], [3])),
                  (Outcome("q0-r0", "q0", RunStatus.SCORED, 1.0),))
    with pytest.raises(TrajectoryError, match="run q0-r1 has no outcome"):
        plan(log, TrajectoryConfig())
