"""Replaying a live run directory in the simulator (gyre_hpc/allocator/sim/replay.py, gyre simulate --trace):
the measured facts become the simulator's inputs, the prediction can be derived by hand, bad files name file:line."""
import json

import pytest

from gyre_hpc.allocator.sim.replay import calibrate, live_prediction, read_run, replay
from gyre_hpc.cli import main
from gyre_hpc.errors import WorkloadError
from replay_rundir import write_run

COLOCATE = ["scheduler.policy=colocate", "cluster.cells=2", "scheduler.batch_groups=1",
            "scheduler.staleness_target=0", "agent.runs_per_group=1", "allocator.steps=2"]
SWITCHES = [
    {"cell": 0, "role": "train", "timing": {"drain_s": 0.2, "engine_stop_s": 0.3, "total_s": 0.9}, "total_s": 1.0},
    {"cell": 1, "role": "train", "timing": {"drain_s": 0.2, "weight_pull_s": 0.5, "total_s": 1.4}, "total_s": 1.5},
    {"cell": 0, "role": "rollout", "timing": {"engine_start_s": 1.9, "total_s": 1.95}, "total_s": 2.0},
    {"cell": 1, "role": "rollout", "timing": {"engine_start_s": 1.9, "total_s": 1.95}, "total_s": 2.0},
]
STEPS = [{"work_s": 2.0, "trained_tokens": 100, "optimizer_s": 0.5}] * 2
GROUPS = [{"end_s": [10.0], "tokens": 100}, {"end_s": [20.0], "tokens": 100}]


@pytest.fixture
def colocate_run(tmp_path):
    return write_run(tmp_path / "run", COLOCATE, GROUPS, SWITCHES, STEPS, span_s=40.0, wall_s=100.0)


def test_calibration_takes_the_measured_switch_training_and_step_costs(colocate_run):
    cal = calibrate(read_run(colocate_run))
    assert cal.sim["to_train_s"] == pytest.approx(1.0)   # (1.0 + (1.5 - 0.5)) / 2: the pull is charged apart
    assert cal.sim["weight_bytes"] / cal.sim["pull_bytes_per_s"] == pytest.approx(0.5)
    assert cal.facts["from_config"] == []
    assert cal.sim["to_rollout_s"] == pytest.approx(2.0)
    assert cal.sim["train_tok_s_per_cell"] == pytest.approx(200 / 4.0)
    assert cal.sim["optimizer_s"] == pytest.approx(0.5) and cal.sim["steps"] == 2
    assert cal.span_s == pytest.approx(40.0)
    assert cal.workload.work_s.tolist() == [10.0, 20.0] and cal.workload.offsets.tolist() == [0, 1, 2]


def test_colocate_replay_gives_the_span_derived_by_hand(colocate_run):
    # B = 1 and E[d] = 0: one group in flight. q0 runs 0-10; both cells drain 10-11; the core trains alone
    # 11-11.5 (0.5 of 2 cell-s), the satellite joins after its 0.5 s pull, the last 1.5 cell-s take 0.75 s
    # (12.25); optimizer 0.5 s: step 1 at 12.75. Both return (2 s, 14.75); q1 was admitted at 12.25, parked,
    # runs 14.75-34.75; drain to 35.75, core alone to 36.25, both to 37.0, optimizer: step 2 at 37.5.
    result, _ = replay(colocate_run)
    assert result["sim_span_s"] == pytest.approx(37.5)
    assert result["sim_wall_s"] == pytest.approx(100.0 - 40.0 + 37.5)
    assert result["sim_error_pct"] == pytest.approx(-2.5)
    assert result["sim_span_error_pct"] == pytest.approx(-6.25)


def test_slower_training_moves_the_prediction_by_the_hand_derived_amount(tmp_path):
    slow = [{**s, "work_s": 4.0} for s in STEPS]  # 2x the training seconds: 4 cell-s per group
    run = write_run(tmp_path / "run", COLOCATE, GROUPS, SWITCHES, slow, span_s=40.0, wall_s=100.0)
    # per step: the core alone 0.5 s (0.5 cell-s), then 3.5 cell-s on two cells = 1.75 s (was 0.75): +1 s per step
    assert replay(run)[0]["sim_span_s"] == pytest.approx(39.5)


def test_what_if_policies_run_on_the_same_trace_and_invalid_ones_say_why(colocate_run):
    result, sims = replay(colocate_run)
    assert list(result["predicted"]) == ["colocate", "gyre"] and set(sims) == {"colocate", "gyre"}
    assert result["predicted"]["gyre"]["span_s"] > 0
    assert "async_train_cells" in result["skipped"]["async"]


def test_a_timed_out_run_never_finishes_and_a_group_cut_at_the_stop_lasts_until_the_stop(tmp_path):
    groups = [{"end_s": [10.0, 30.0], "tokens": 60, "status": ["scored", "timeout_partial"]}]
    run = write_run(tmp_path / "run", COLOCATE + ["agent.runs_per_group=2"], groups, SWITCHES, STEPS,
                    span_s=40.0, wall_s=None, cut_groups=1)
    live = read_run(run)
    assert [g["censored"] for g in live.groups] == [False, True]
    assert live.groups[1]["end_s"] == [pytest.approx(40.5)] * 2  # admitted at the first admission, shutdown at 40.5
    wl = calibrate(live).workload
    assert wl.work_s[0] == 10.0 and wl.work_s[1] == float("inf") and wl.work_s[2:].tolist() == [40.5, 40.5]
    assert wl.tok_per_work_s[1] == pytest.approx(30 / 30.0)  # 60 tokens / 2 runs over the 30 s timeout


def test_runs_are_timed_from_the_admission_order_and_include_the_group_build(tmp_path):
    groups = [{"end_s": [10.0], "tokens": 100, "lag": 3.0, "build": 0.5}, {"end_s": [20.0], "tokens": 100}]
    run = write_run(tmp_path / "run", COLOCATE, groups, SWITCHES, STEPS, span_s=40.0, wall_s=100.0)
    assert calibrate(read_run(run)).workload.work_s.tolist() == [pytest.approx(13.5), 20.0]
    # the hand-derived timeline of the colocate test with q0 3.5 s longer
    assert replay(run)[0]["sim_span_s"] == pytest.approx(37.5 + 3.5)


def test_a_switch_the_run_never_made_keeps_the_configs_value(tmp_path):
    run = write_run(tmp_path / "run", COLOCATE + ["sim.to_train_s=3.0", "sim.to_rollout_s=4.0"], GROUPS, [],
                    STEPS, span_s=40.0, wall_s=100.0)
    result, _ = replay(run)
    c = result["calibration"]
    assert c["from_config"] == ["to_train_s", "to_rollout_s", "weight_bytes"]
    assert (c["to_train_s"], c["to_rollout_s"]) == (3.0, 4.0)


def test_same_run_directory_gives_the_same_prediction(colocate_run):
    assert replay(colocate_run)[0] == replay(colocate_run)[0]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "groups.jsonl").unlink(), r"groups.jsonl: missing"),
    (lambda d: (d / "groups.jsonl").write_text('{"gid": 0, "t_admit": 1.0}\n{oops\n'),
     r"groups.jsonl:2: invalid JSON"),
    (lambda d: (d / "groups.jsonl").write_text('{"gid": 0, "t_admit": 1, "trained_tokens": 5, '
                                               '"runs": [{"end_s": -1, "status": "scored"}]}\n'),
     r"groups.jsonl:1: end_s must be a number >= 0, got -1"),
    (lambda d: (d / "metrics.jsonl").write_text('{"trained_tokens": 5}\n'), r"metrics.jsonl:1: optimizer_s must be"),
    (lambda d: (d / "config.yaml").write_text("scheduler:\n  policy: nope\n"), r"config.yaml: .*scheduler.policy"),
    (lambda d: (d / "events.jsonl").write_text('{"event": "start", "t": 0, "wall": 0}\n' * 2),
     r"events.jsonl: the run was resumed"),
    (lambda d: (d / "events.jsonl").write_text('{"event": "start", "t": 0, "wall": 0}\n[1]\n'),
     r"events.jsonl:2: an event record is a JSON object"),
    (lambda d: (d / "events.jsonl").write_text('{"event": "start", "t": 0, "wall": 0}\n'
                                               '{"event": "switch_done", "t": 1, "wall": 1, "cell": 0}\n'),
     r"events.jsonl:2: total_s must be a number >= 0, got None"),
])
def test_a_malformed_run_directory_names_the_file_and_line(colocate_run, damage, message):
    damage(colocate_run)
    with pytest.raises(Exception, match=message) as info:
        replay(colocate_run)
    assert info.type.__name__ in ("WorkloadError", "ProtocolError")


def test_an_old_run_directory_without_training_times_says_so(colocate_run):
    ev = [json.loads(line) for line in (colocate_run / "events.jsonl").read_text().splitlines()]
    (colocate_run / "events.jsonl").write_text("".join(json.dumps({k: v for k, v in e.items() if k != "work_s"}) + "\n"
                                                       for e in ev))
    with pytest.raises(WorkloadError, match="no train_progress record carries work_s"):
        replay(colocate_run)


def test_live_summary_keys_and_a_failed_replay_does_not_fail_the_run(colocate_run, tmp_path):
    keys = live_prediction(colocate_run, 100.0)
    assert keys["sim_wall_s"] == pytest.approx(97.5) and keys["sim_error_pct"] == pytest.approx(-2.5)
    assert keys["measured_span_s"] == pytest.approx(40.0)
    broken = live_prediction(tmp_path / "nowhere", 100.0)
    assert broken["sim_wall_s"] is None and "not a directory" in broken["sim_error"]


def test_cli_trace_json_table_and_plot(colocate_run, tmp_path, capsys):
    assert main(["simulate", "--trace", str(colocate_run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sim_span_s"] == pytest.approx(37.5) and out["measured"]["span_s"] == pytest.approx(40.0)
    assert main(["simulate", "--trace", str(colocate_run), "--plot", str(tmp_path / "p")]) == 0
    table = capsys.readouterr().out
    assert "measured (colocate)" in table and "simulated gyre (what-if)" in table and "-2.5%" in table
    png = tmp_path / "p" / "replay_roles.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_cli_needs_exactly_one_of_config_and_trace(colocate_run, capsys):
    assert main(["simulate", "configs/sim/small.yaml", "--trace", str(colocate_run)]) == 2
    assert "exactly one" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(colocate_run), "--set", "sim.to_train_s=-1"]) == 2
    assert "sim.to_train_s" in capsys.readouterr().err


def test_lost_cells_are_reported_not_replayed(colocate_run, capsys):
    lost = {"t": 60.0, "wall": 1.0, "event": "lost", "cell": 1, "reason": "heartbeat", "silent_s": 60.0}
    with open(colocate_run / "events.jsonl", "a") as f:
        f.write(json.dumps(lost) + "\n")
    assert calibrate(read_run(colocate_run)).facts["lost_cells"] == [1]
    assert main(["simulate", "--trace", str(colocate_run)]) == 0
    assert "cells [1] were lost in the run" in capsys.readouterr().out
