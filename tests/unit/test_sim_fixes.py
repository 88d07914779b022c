"""Simulator fixes of issue 13: trajectory.j_max is honoured, each switch is counted once, and a relative
workload.trace resolves against the config file's directory."""
import json
import shutil
from pathlib import Path

import pytest

from gyre_hpc.allocator.policies import make_policy
from gyre_hpc.allocator.sim import workload as wlm
from gyre_hpc.allocator.sim.compare import compare, queries_needed
from gyre_hpc.allocator.sim.metrics import summarize
from gyre_hpc.allocator.sim.simulator import Simulation
from gyre_hpc.allocator.types import Switch
from gyre_hpc.cli import main
from gyre_hpc.config import load_config

SMALL = "configs/sim/small.yaml"


def _result(*overrides):
    result, _ = compare(load_config(SMALL, ["sim.policies=[gyre, colocate]", *overrides]))
    return result


def test_jmax_changes_the_trained_tokens_and_the_wall_time():
    one, five, every = (_result(f"trajectory.j_max={j}") for j in ("1", "5", "null"))
    tok = [r["workload"]["trained_tokens_per_run_mean"] for r in (one, five, every)]
    assert tok[0] < tok[1] <= tok[2]
    assert tok[0] < 0.6 * tok[1]  # a 60-turn median run of 20-turn paths: J_max 1 trains about a third of it
    assert one["policies"]["gyre"]["hours"] != five["policies"]["gyre"]["hours"]


def test_jmax_bounds_each_runs_trained_work_by_its_last_paths():
    cfg = load_config(SMALL)
    wl = wlm.parametric(cfg.workload, cfg.sim, 10, 0, j_max=2)
    turn = cfg.workload.tool_s_per_turn + (cfg.workload.prefill_tokens_per_turn / cfg.sim.prefill_tok_s
                                           + cfg.workload.decode_tokens_per_turn / cfg.sim.decode_tok_s)
    assert wl.train_window_s == pytest.approx([2 * cfg.workload.path_turns * turn] * wl.work_s.size)
    assert (wlm.parametric(cfg.workload, cfg.sim, 10, 0, j_max=None).train_window_s == float("inf")).all()


class CountingSwitches:
    """A real policy whose Switch orders are counted (the simulator applies each exactly once)."""

    def __init__(self, inner):
        self.inner, self.orders = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, state, now):
        orders = self.inner.decide(state, now)
        self.orders += sum(isinstance(o, Switch) for o in orders)
        return orders


@pytest.mark.parametrize("name", ["gyre", "colocate", "colocate_streaming"])
def test_each_switch_is_counted_once(name):
    cfg = load_config(SMALL)
    wl = wlm.load(cfg.workload, cfg.sim, queries_needed(cfg), 0, j_max=cfg.trajectory.j_max)
    policy = CountingSwitches(make_policy(name, cfg.scheduler, cfg.cluster.cells))
    sim = Simulation(policy, cfg.sim, cfg.scheduler, wl, cfg.cluster.cells, cfg.workload.timeout_h * 3600)
    end = sim.run()
    assert policy.orders > 0
    assert summarize(sim, end, 1.0)["switches"] == policy.orders


def test_a_relative_trace_resolves_against_the_config_files_directory(tmp_path, monkeypatch, capsys):
    cfg = load_config(SMALL)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    wlm.write_trace(conf_dir / "runs.jsonl", wlm.parametric(cfg.workload, cfg.sim, 30, 0, j_max=5), 7200.0)
    shutil.copy(SMALL, conf_dir / "small.yaml")
    text = (conf_dir / "small.yaml").read_text().replace("workload:\n", "workload:\n  trace: runs.jsonl\n", 1)
    (conf_dir / "small.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the trace is not in the working directory
    loaded = load_config(conf_dir / "small.yaml")
    assert loaded.workload.trace == str(conf_dir / "runs.jsonl")
    assert main(["simulate", str(conf_dir / "small.yaml"), "--json", "--set", "sim.steps=2",
                 "--set", "sim.policies=[gyre]"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]["gyre"]["hours"] > 0


def test_a_relative_trace_given_by_an_override_resolves_against_the_working_directory(tmp_path, monkeypatch):
    small = Path(SMALL).resolve()
    monkeypatch.chdir(tmp_path)
    cfg = load_config(small, ["workload.trace=runs.jsonl"])
    assert cfg.workload.trace == "runs.jsonl"


def test_a_jmax_sweep_gives_different_rows(tmp_path, capsys):
    assert main(["simulate", SMALL, "--set", "sim.policies=[gyre]", "--sweep", "trajectory.j_max=1,5",
                 "--json", "--out", str(tmp_path / "sw")]) == 0
    one, five = json.loads(capsys.readouterr().out)
    assert one["trained_tokens_per_run"] < five["trained_tokens_per_run"]
    assert one["gyre_hours"] != five["gyre_hours"]
