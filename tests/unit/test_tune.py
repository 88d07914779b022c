"""``gyre tune``: the simulator chooses theta, tau_s, mu and the cell split; the overlay it writes loads back."""
import json

import pytest
import yaml

from gyre_hpc.allocator.sim.tune import SPACE, tune, workload_for
from gyre_hpc.cli import main
from gyre_hpc.config import load_config, overlay_overrides

SMALL = "configs/sim/small.yaml"
FAST = ["--set", "sim.steps=6", "--set", "sim.policies=[gyre, async]"]


def test_tune_on_the_small_config_writes_a_loadable_overlay(tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    assert main(["tune", SMALL, "--budget", "8", "--out", str(out), "--json", *FAST]) == 0
    record = json.loads(capsys.readouterr().out)
    overlay = yaml.safe_load(out.read_text())
    assert set(overlay) == {"scheduler"} and set(overlay["scheduler"]) == set(SPACE)
    assert overlay == record["overlay"] and len(record["evaluated"]) <= 8
    assert record["score_hours"] <= record["start_score_hours"]
    cfg = load_config(SMALL, overlay_overrides(out))
    assert {k: getattr(cfg.scheduler, k) for k in SPACE} == overlay["scheduler"]
    assert main(["simulate", SMALL, "--overlay", str(out), "--json", *FAST]) == 0
    hours = {k: v["hours"] for k, v in json.loads(capsys.readouterr().out)["policies"].items()}
    assert hours == pytest.approx(record["hours"])  # the overlay reproduces the predicted point


def test_overlay_and_set_apply_in_command_line_order(tmp_path, capsys):
    out = tmp_path / "o.yaml"
    out.write_text("scheduler: {theta: 0.75, mu: 2}\n")
    assert main(["config", "show", SMALL, "--overlay", str(out), "--set", "scheduler.mu=3"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["scheduler"]
    assert (shown["theta"], shown["mu"]) == (0.75, 3)  # --set after the overlay wins
    assert main(["config", "show", SMALL, "--set", "scheduler.mu=3", "--overlay", str(out)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["scheduler"]["mu"] == 2  # the overlay after --set wins


def test_an_overlay_with_an_unknown_key_fails_with_the_dotted_key(tmp_path):
    out = tmp_path / "bad.yaml"
    out.write_text("scheduler: {thetta: 0.5}\n")
    with pytest.raises(Exception, match="unknown key scheduler.thetta"):
        load_config(SMALL, overlay_overrides(out))


def test_tuning_is_deterministic_and_respects_the_budget():
    cfg = load_config(SMALL, ["sim.steps=6", "sim.policies=[gyre, colocate]"])
    wl = workload_for(cfg)
    a, b = tune(cfg, wl, budget=5), tune(cfg, wl, budget=5)
    assert a.best == b.best and len(a.evaluated) == 5
    assert a.best_score <= a.start_score
    assert all(set(p) >= set(SPACE) for p in a.evaluated)
    assert all(p["async_train_cells"] == cfg.scheduler.async_train_cells for p in a.evaluated)  # no async policy


def test_tune_takes_a_live_runs_directory(tmp_path, capsys):
    from test_sim_replay import COLOCATE, GROUPS, STEPS, SWITCHES
    from replay_rundir import write_run

    run = write_run(tmp_path / "run", COLOCATE, GROUPS, SWITCHES, STEPS, span_s=40.0, wall_s=100.0)  # 2 cells
    out = tmp_path / "live-tuned.yaml"
    assert main(["tune", "--trace", str(run), "--budget", "4", "--out", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert yaml.safe_load(out.read_text()) == record["overlay"] and set(record["hours"]) == {"gyre", "colocate"}


def test_gyres_satellite_threshold_is_searched_for_gyre_alone():
    from gyre_hpc.allocator.sim.tune import READS, grid

    cfg = load_config(SMALL, [])
    assert [n for n, keys in READS.items() if "satellite_min_work_s" in keys] == ["gyre"]
    values = grid("satellite_min_work_s", cfg, 3600.0)
    own = cfg.scheduler.satellite_min_work_s
    assert own in values and 0.0 in values and min(v for v in values if v > 0) < own < max(values)


def test_the_committed_trainheavy_overlay_is_what_gyre_tune_chooses_on_its_trace(tmp_path, capsys):
    """benchmarks/results/tuned/live_trainheavy.yaml came from its header's command on the committed trace: the
    live benchmark's knobs stay reproducible (one tuning path for all policies, issue 13)."""
    committed = "benchmarks/results/tuned/live_trainheavy.yaml"
    out = tmp_path / "again.yaml"
    assert main(["tune", "--trace", "tests/unit/data/live_trainheavy_gyre", "--budget", "24",
                 "--set", "scheduler.staleness_target=1.0", "--set", "sim.steps=12", "--out", str(out)]) == 0
    capsys.readouterr()
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(open(committed).read())
