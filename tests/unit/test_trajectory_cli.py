"""``gyre trajectory`` synth → stats → pack, through the real command line entry point."""
import json
import subprocess
import sys

import numpy as np

from gyre_hpc.cli import main
from gyre_hpc.trajectory.pipeline import STATS_KEYS, load_packed


def gyre(*args):
    return main(["trajectory", *map(str, args)])


def test_stats_json_has_exactly_the_documented_keys(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert gyre("synth", "--out", log, "--queries", 4, "--runs", 3, "--seed", 2, "--retry-prob", 0.5) == 0
    capsys.readouterr()
    assert gyre("stats", log, "--json", "--j-max", 1) == 0
    one = json.loads(capsys.readouterr().out)
    assert tuple(one) == STATS_KEYS
    assert gyre("stats", log, "--json", "--j-max", "null") == 0
    unlimited = json.loads(capsys.readouterr().out)
    assert one["paths_dropped"] > 0 == unlimited["paths_dropped"]
    assert one["paths"] + one["paths_dropped"] == unlimited["paths"]
    assert unlimited["tree_tokens"] < unlimited["flat_tokens"]


def test_pack_writes_a_batch_that_matches_stats(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    gyre("synth", "--out", log, "--queries", 3, "--runs", 3, "--seed", 5)
    capsys.readouterr()
    gyre("stats", log, "--json")
    stats = json.loads(capsys.readouterr().out)
    for mode in ("tree", "flat"):
        assert gyre("pack", log, "--out", tmp_path / mode, "--mode", mode) == 0
        batch = load_packed(tmp_path / mode)
        assert batch.trained_tokens == stats["trained_tokens"]
        assert batch.tokens == stats["tree_tokens" if mode == "tree" else "flat_tokens"]
        report = json.loads((tmp_path / mode / "report.json").read_text())
        assert {k: report[k] for k in STATS_KEYS} == stats


def test_bad_log_exits_2_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "outcome", "run_id": "q0-r0", "query_id": "q0", "status": "scored", "score": 2, '
                   '"t_end": 1}\n')
    out = subprocess.run([sys.executable, "-m", "gyre_hpc.cli", "trajectory", "stats", str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and f"{bad}:1: outcome of run q0-r0: status scored needs a score" in out.stderr
    assert out.stdout == ""


def test_human_stats_print_ratio_and_branch_kinds(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    gyre("synth", "--out", log, "--queries", 3, "--runs", 3, "--seed", 1, "--subagent-prob", 0.5)
    capsys.readouterr()
    assert gyre("stats", log, "--set", "trajectory.selection=longest") == 0
    text = capsys.readouterr().out
    assert "tree/flat" in text and "branches.subagent" in text and "eval_failures" in text
