"""A short live training through the real runtime: ``gyre train`` launches itself with mpirun (1 + 3 ranks).

Rank 0 runs the allocator server with the colocate policy object (deterministic role changes: every cell
switches to training when a batch is ready and back after the step), the proxy subprocess, the harness and
the data-plane hub; ranks 1-3 run real local engines, the core's megatron trainer and two satellites that
pull the core's weights over Mooncake. Nothing is stubbed.
"""
import json
import pytest

from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.trajectory.records import read_tito
from live_run import AGENT_TIMEOUT, run_live
from slurm_cluster import mpirun  # noqa: F401  (fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]

OVERRIDES = [
    "cluster.cells=3", "scheduler.policy=colocate", "scheduler.batch_groups=2", "allocator.steps=2",
    "agent.runs_per_group=4", "agent.turns=[1, 2]", AGENT_TIMEOUT, "run.name=ci",
    "allocator.hello_timeout_s=300", "proxy.startup_timeout_s=300", "train.epochs=2",
    "engine.sleep_in_training=false",  # engines stop and start at each switch: this file tests that path (the
    # default since issue 31 is to sleep: test_live_sleep, test_live_gyre)
]


@pytest.fixture(scope="module")
def live_run(mpirun, tmp_path_factory):
    return run_live(tmp_path_factory.mktemp("live"), OVERRIDES)


def test_live_run_trains_the_requested_steps_and_shuts_down_in_order(live_run):
    summary, run_dir, _ = live_run
    assert summary["policy"] == "colocate" and summary["steps"] == 2
    assert summary["stop"]["reason"] == "2 optimizer steps done"
    assert summary["stop"]["lost"] == [] and summary["stop"]["no_bye"] == []
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2] and all(s["groups"] == 2 for s in steps)
    assert [s["gids"] for s in steps] == [[0, 1], [2, 3]]  # fixed batches: whole, in admission order
    assert json.loads((run_dir / "weights" / "LATEST.json").read_text())["version"] == 2
    assert (run_dir / "checkpoints" / "latest" / "meta.json").is_file()
    for png in ("roles.png", "reward.png", "query_durations.png", "staleness.png"):
        assert (run_dir / png).stat().st_size > 1000


def test_each_step_is_reported_once_and_reaches_the_allocator_in_the_pass_the_hub_takes_it(live_run):
    _, run_dir, _ = live_run
    events = read_events(run_dir / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert "rejected" not in kinds
    at = [i for i, k in enumerate(kinds) if k == "step"]
    assert [events[i]["version"] for i in at] == [1, 2]
    assert all(kinds[i + 1] == "train_step" and events[i + 1]["version"] == events[i]["version"] for i in at)


def test_cells_switch_both_ways_with_a_timing_breakdown(live_run):
    summary, run_dir, _ = live_run
    assert summary["switches_r2t"] >= 1 and summary["switches_t2r"] >= 1
    done = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "switch_done"]
    to_train = [e["timing"] for e in done if e["role"] == "train"]
    to_rollout = [e["timing"] for e in done if e["role"] == "rollout"]
    assert to_train and to_rollout
    assert all({"drain_s", "engine_stop_s", "total_s"} <= set(t) for t in to_train)
    assert all({"engine_start_s", "register_s", "total_s"} <= set(t) for t in to_rollout)


def test_a_satellite_pulls_the_cores_weights_over_mooncake_with_matching_checksums(live_run):
    summary, run_dir, _ = live_run
    assert summary["weight_pulls"] >= 1 and summary["weight_pull_checksum_ok"] is True
    pulls = [p for f in (run_dir / "cells").glob("cell*.json") for p in json.loads(f.read_text())["pulls"]]
    assert pulls and all(p["backend"] == "mooncake" and p["bytes"] > 0 for p in pulls)
    satellites_trained = {c for s in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
                          for c in s["cells"] if c != 0}
    assert satellites_trained, "no satellite trained a group"


def test_engines_get_each_new_version_by_a_checksummed_pull_and_a_distributed_push(live_run):
    """Engines start on the seed's weights; every later version reaches them by the one road (docs/weights.md)."""
    summary, run_dir, _ = live_run
    syncs = [s for f in (run_dir / "cells").glob("cell*.json") for s in json.loads(f.read_text())["weight_syncs"]]
    assert syncs and all(s["backend"] == "mooncake" and s["checksum_ok"] and s["bytes"] > 0 for s in syncs)
    assert max(s["version"] for s in syncs) >= 1 and all(s["push_attempts"] >= 1 for s in syncs)


def test_no_run_is_lost_and_every_finished_run_has_a_reward(live_run):
    summary, run_dir, _ = live_run
    assert summary["runs_lost"] == 0
    assert summary["runs_finished"] >= 2 * 2 * 4
    assert summary["runs_scored"] == summary["runs_finished"], summary["run_statuses"]
    outcomes = [o for f in (run_dir / "tito").glob("q*.jsonl") for o in read_tito(f).outcomes]
    assert len(outcomes) == summary["runs_finished"] and all(o.score is not None for o in outcomes)
    assert summary["reward_first"] is not None and summary["reward_last"] is not None


def test_staleness_is_measured_from_the_generating_versions(live_run):
    summary, run_dir, stderr = live_run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["staleness_max"] == 0  # the first step trains version-0 tokens at version 0
    assert 0 <= summary["staleness_mean"] <= summary["staleness_max"] <= 2
    assert "[gyre colocate] step" in stderr  # the live progress line


def test_staleness_splits_into_prequeue_and_inqueue_parts_that_add_up_per_step(live_run):
    summary, run_dir, _ = live_run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for s in steps:
        pre, inq = s["staleness_prequeue_mean"], s["staleness_inqueue_mean"]
        assert pre >= 0 and inq >= 0 and pre + inq == pytest.approx(s["staleness_mean"], abs=1e-9), s
        assert max(s["staleness_prequeue_max"], s["staleness_inqueue_max"]) <= s["staleness_max"]
    logged = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "train_step"]
    assert [e["staleness_inqueue_mean"] for e in logged] == [s["staleness_inqueue_mean"] for s in steps]
    split = summary["staleness_prequeue_mean"] + summary["staleness_inqueue_mean"]
    assert split == pytest.approx(summary["staleness_mean"], abs=1e-9)
    assert summary["staleness_inqueue_max"] <= summary["staleness_max"]


def test_each_step_makes_train_epochs_updates_over_all_its_groups_and_one_version(live_run):
    _, run_dir, _ = live_run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(s["epochs"] == 2 and s["loss_last_epoch"] is not None for s in steps)
    assert all(set(s["epoch_gids"]) <= set(s["gids"]) for s in steps)
    # a satellite's group comes back to the core for epoch 2 (the steps where every group trained tokens)
    assert any(s["epoch_gids"] == sorted(s["gids"]) and set(s["cells"]) - {0} for s in steps), steps


def test_summary_reports_the_train_inference_logprob_agreement_of_same_version_tokens(live_run):
    summary, run_dir, _ = live_run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = steps[0]  # version-0 tokens trained at version 0 (core and satellites alike): every token compares
    assert first["logprob_abs_diff_tokens"] == first["trained_tokens"] > 0
    assert 0 <= first["logprob_abs_diff_mean"] <= first["logprob_abs_diff_max"] < 1e-3  # same float32 model
    assert summary["logprob_abs_diff_tokens"] == sum(s["logprob_abs_diff_tokens"] for s in steps)
    assert summary["logprob_abs_diff_max"] == max(s["logprob_abs_diff_max"] for s in steps
                                                  if s["logprob_abs_diff_tokens"])
