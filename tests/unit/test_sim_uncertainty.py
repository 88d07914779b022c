"""``gyre simulate --seeds N [--perturb F]``: a band over seeds and perturbed inputs, and the sensitivity ranking."""
import json

import pytest

from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.allocator.sim.uncertainty import band, sensitivity
from gyre_hpc.cli import main
from gyre_hpc.config import load_config

SMALL = "configs/sim/small.yaml"
FAST = ["sim.steps=4", "sim.policies=[gyre, colocate]"]


def test_one_seed_without_perturbation_is_the_point_prediction():
    cfg = load_config(SMALL, FAST)
    point, _ = compare(cfg)
    b = band(cfg, 1)
    for name, e in b["policies"].items():
        assert e["hours"]["median"] == e["hours"]["min"] == e["hours"]["max"] == point["policies"][name]["hours"]


def test_the_band_spreads_over_seeds_and_is_reproducible():
    cfg = load_config(SMALL, FAST)
    a, b = band(cfg, 4, 0.2), band(cfg, 4, 0.2)
    assert a == b
    h = a["policies"]["gyre"]["hours"]
    assert h["min"] < h["max"] and h["min"] <= h["p10"] <= h["median"] <= h["p90"] <= h["max"]
    assert a["policies"]["colocate"]["vs_gyre"]["median"] > 0


@pytest.mark.slow
def test_sensitivity_ranks_the_inputs_by_their_largest_effect():
    cfg = load_config(SMALL, FAST)
    rows = sensitivity(cfg, 0.2)
    effects = [r["max_abs_pct"] for r in rows]
    assert effects == sorted(effects, reverse=True) and effects[0] > 1.0
    assert rows[0]["input"] in ("workload.turns_median", "workload.tool_s_per_turn", "workload.query_sigma",
                                "sim.decode_tok_s")


@pytest.mark.slow
def test_cli_prints_the_band_and_the_sensitivity_line(capsys):
    sets = [a for s in FAST for a in ("--set", s)]
    assert main(["simulate", SMALL, "--seeds", "3", "--perturb", "0.1", *sets]) == 0
    out = capsys.readouterr().out
    assert "band over 3 seeds, inputs perturbed +-10%" in out and "most sensitive to workload." in out
    assert main(["simulate", SMALL, "--seeds", "2", "--json", *sets]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["band"]["seeds"] == 2 and result["sensitivity"][0]["input"]


@pytest.mark.parametrize("args", [["--seeds", "0"], ["--seeds", "2", "--perturb", "1.5"]])
def test_bad_band_options_fail_with_one_line(args, capsys):
    assert main(["simulate", SMALL, *args, "--set", "sim.steps=2"]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
