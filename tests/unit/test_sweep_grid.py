"""gyre_hpc.sweep: grid parsing and checks, expansion order, per-element validation, result tables."""
import csv

import pytest

from gyre_hpc.errors import ConfigError
from gyre_hpc.sweep import (COMPLETED, Axis, ElementOutcome, expand, load_elements, markdown_table, metric_columns,
                            parse_grid, result_rows, split_values, write_results)

SMALL = "configs/sim/small.yaml"


def test_values_split_on_commas_outside_brackets_and_stay_text():
    assert split_values("1,3, null") == ["1", "3", "null"]
    assert split_values("[1, 2],[1, 3]") == ["[1, 2]", "[1, 3]"]
    axes = parse_grid(["trajectory.j_max=1,3,5,null", "agent.turns=[1, 2],[1, 3]"])
    assert axes == (Axis("trajectory.j_max", ("1", "3", "5", "null")), Axis("agent.turns", ("[1, 2]", "[1, 3]")))


@pytest.mark.parametrize("spec, message", [
    ("trajectory.jmax=1,2", "unknown config key; did you mean trajectory.j_max"),
    ("scheduler.stalenes_target=1", "did you mean scheduler.staleness_target"),
    ("trajectory.zzzzzz=1", "valid keys of trajectory: trajectory.j_max"),
    ("trajectory.jmax=1", "; valid keys of trajectory: trajectory.j_max"),
    ("nosection.key=1", "sections: agent, agent.mini_swe_agent, allocator"),
    ("scheduler=1,2", "is a section, not a value; sweep one of its keys: scheduler.policy"),
    ("trajectory.j_max=1,,3", "an empty value"),
    ("trajectory.j_max=", "an empty value"),
    ("trajectory.j_max", "expected key.path=v1,v2"),
])
def test_bad_grid_specs_fail_with_the_nearest_valid_keys(spec, message):
    with pytest.raises(ConfigError) as info:
        parse_grid([spec])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_key_given_twice_or_no_axis_at_all_fails():
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["trajectory.j_max=1", "trajectory.j_max=3"])
    with pytest.raises(ConfigError, match="at least one --grid"):
        parse_grid([])


def test_expand_is_the_full_product_with_the_last_axis_fastest():
    els = expand(parse_grid(["trajectory.j_max=1,null", "scheduler.staleness_target=1,1.5,2"]))
    assert [e.index for e in els] == list(range(6))
    assert [e.overrides for e in els[:4]] == [
        ["trajectory.j_max=1", "scheduler.staleness_target=1"], ["trajectory.j_max=1", "scheduler.staleness_target=1.5"],
        ["trajectory.j_max=1", "scheduler.staleness_target=2"], ["trajectory.j_max=null", "scheduler.staleness_target=1"]]
    assert els[5].label == "j_max=null staleness_target=2"


def test_every_element_is_loaded_and_typed_like_a_set_override():
    els = expand(parse_grid(["trajectory.j_max=1,null", "scheduler.staleness_target=1,1.5"]))
    cfgs = load_elements(SMALL, ["sim.steps=4"], els)
    assert [(c.trajectory.j_max, c.scheduler.staleness_target, c.sim.steps) for c in cfgs] == [
        (1, 1.0, 4), (1, 1.5, 4), (None, 1.0, 4), (None, 1.5, 4)]


def test_a_value_that_fails_the_config_check_names_the_element_and_the_key():
    els = expand(parse_grid(["scheduler.staleness_target=1,-1"]))
    with pytest.raises(ConfigError) as info:
        load_elements(SMALL, [], els)
    assert str(info.value) == ("grid element 1 (staleness_target=-1): scheduler.staleness_target: must be >= 0, "
                               "got -1.0")


def test_the_element_check_runs_on_every_element_before_any_is_used():
    seen = []

    def check(cfg):
        seen.append(cfg.cluster.cells)
        if cfg.cluster.cells == 2:
            raise ConfigError("cluster.cells: too few")

    with pytest.raises(ConfigError, match=r"grid element 1 \(cells=2\): cluster.cells: too few"):
        load_elements(SMALL, [], expand(parse_grid(["cluster.cells=4,2,8"])), check)
    assert seen == [4, 2]


def test_a_missing_config_fails_once_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match=f"config file not found: {tmp_path / 'nope.yaml'}"):
        load_elements(tmp_path / "nope.yaml", [], expand(parse_grid(["trajectory.j_max=1"])))


def outcomes():
    return [ElementOutcome(COMPLETED, {"gyre_hours": 1.5, "colocate_hours": 2.0}, job_id="7_0"),
            ElementOutcome("FAILED", {}, "Traceback (most recent call last):\n  File x\nSchedulingError: a | b\n", "7_1")]


def test_failed_elements_keep_their_row_with_the_error_tail():
    els = expand(parse_grid(["cluster.cells=4,8"]))
    rows = result_rows(els, outcomes())
    assert [(r["element"], r["status"], r["cluster.cells"], r["job"]) for r in rows] == [
        (0, COMPLETED, "4", "7_0"), (1, "FAILED", "8", "7_1")]
    assert rows[0]["error"] == "" and rows[1]["error"] == "File x / SchedulingError: a | b"
    with pytest.raises(ValueError):
        result_rows(els, outcomes()[:1])


def test_markdown_cells_never_break_the_table():
    table = markdown_table([{"a": "x|y", "b": "one\ntwo"}])
    assert table.splitlines()[2] == "| x\\|y | one two |"
    assert all(line.count("|") - line.count("\\|") == 3 for line in table.splitlines())


def test_results_are_written_as_csv_and_markdown_with_the_failures_listed(tmp_path):
    rows = result_rows(expand(parse_grid(["cluster.cells=4,8"])), outcomes())
    csv_path, md_path = write_results(rows, tmp_path, "t")
    got = list(csv.DictReader(csv_path.open()))
    assert [(r["status"], r["gyre_hours"]) for r in got] == [(COMPLETED, "1.5"), ("FAILED", "")]
    assert list(got[0])[-1] == "error"
    md = md_path.read_text()
    assert "1 of 2 elements completed." in md
    assert "- element 1 (FAILED): File x / SchedulingError: a \\| b" not in md  # the list is not a table
    assert "- element 1 (FAILED): File x / SchedulingError: a | b" in md
    assert not list(tmp_path.glob(".tmp-*"))


def test_the_plotted_metrics_are_hours_per_policy_or_the_training_metrics():
    rows = result_rows(expand(parse_grid(["cluster.cells=4,8"])), outcomes())
    assert metric_columns(rows, simulate=True) == ["gyre_hours", "colocate_hours"]
    train = [{"element": 0, "status": COMPLETED, "wall_s": 3, "reward_last": 0.5, "staleness_mean": 0.2, "error": ""}]
    assert metric_columns(train, simulate=False) == ["wall_s", "reward_last", "staleness_mean"]
