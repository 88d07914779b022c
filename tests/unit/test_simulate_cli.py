"""``gyre simulate``: the JSON contract, plots, sweeps, and bad input failing before anything runs."""
import csv
import json

import pytest

from gyre_hpc.cli import main

SMALL = "configs/sim/small.yaml"
FAST = ["--set", "sim.steps=4", "--set", "sim.policies=[gyre,colocate,async]"]


def test_json_has_the_documented_keys(capsys):
    assert main(["simulate", SMALL, "--json", *FAST]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"gyre", "colocate", "async"}
    for r in out["policies"].values():
        for key in ("hours", "train_idle_frac", "rollout_idle_frac", "staleness_mean", "staleness_sample_mean",
                    "staleness_p50", "staleness_p99", "staleness_max"):
            assert isinstance(r[key], float)
        assert r["hours"] > 0
    for key in ("frac_queries_ge_4h", "frac_queries_hit_timeout", "frac_queries_within_5pct_of_timeout"):
        assert 0.0 <= out["workload"][key] <= 1.0
    assert out["speedups"]["gyre_vs_async"] == pytest.approx(
        out["policies"]["async"]["hours"] / out["policies"]["gyre"]["hours"])


def test_table_output_names_every_policy(capsys):
    assert main(["simulate", SMALL, *FAST]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("gyre", "colocate", "async")) and "hit the 2 h timeout" in out


def test_plots_are_written(tmp_path, capsys):
    assert main(["simulate", SMALL, *FAST, "--plot", str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"gantt_gyre.png", "gantt_colocate.png", "gantt_async.png", "query_durations.png",
                     "staleness.png"}
    for p in tmp_path.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_sweep_writes_csv_and_markdown(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["simulate", SMALL, *FAST, "--sweep", "cluster.cells=3,4", "--sweep", "scheduler.theta=0.25,1.0",
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert [(r["cluster.cells"], r["scheduler.theta"]) for r in rows] == [
        ("3", "0.25"), ("3", "1.0"), ("4", "0.25"), ("4", "1.0")]
    assert all(float(r["gyre_hours"]) > 0 and float(r["gyre_vs_colocate"]) > 0 for r in rows)
    md = (out / "sweep.md").read_text().splitlines()
    assert md[0].startswith("| cluster.cells | scheduler.theta | gyre_hours") and len(md) == 2 + len(rows)


@pytest.mark.parametrize("args, message", [
    (["--set", "scheduler.theta=0"], r"scheduler.theta: must be in (0, 1]"),
    (["--set", "cluster.cells=1"], "cluster.cells: gyre needs at least 2 cells"),
    (["--set", "scheduler.async_train_cells=4"], "scheduler.async_train_cells: 4 of 4 cells leaves no rollout"),
    (["--set", "workload.timeout_h=-2"], "workload.timeout_h: must be > 0"),
    (["--sweep", "scheduler.theta=0.5,2"], "scheduler.theta: must be in (0, 1]"),
    (["--sweep", "cluster.cells=4,2"], "scheduler.async_train_cells: 2 of 2 cells leaves no rollout"),
    (["--set", "workload.trace=/nonexistent.jsonl"], "workload.trace: file not found"),
])
def test_bad_input_fails_with_the_dotted_key_before_running(args, message, capsys, tmp_path):
    assert main(["simulate", SMALL, *FAST, *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_trace_replays_through_the_cli(tmp_path, capsys):
    from gyre_hpc.allocator.sim import workload as wlm
    from gyre_hpc.config import load_config

    cfg = load_config(SMALL)
    trace = tmp_path / "runs.jsonl"
    wlm.write_trace(trace, wlm.parametric(cfg.workload, cfg.sim, 30, 0), cfg.workload.timeout_h * 3600)
    assert main(["simulate", SMALL, "--json", *FAST, "--set", f"workload.trace={trace}"]) == 0
    out = json.loads(capsys.readouterr().out)
    gyre = out["policies"]["gyre"]
    assert gyre["hours"] > 0 and gyre["queries_completed"] >= 4 * 8  # 4 steps of 8 groups, from the trace
