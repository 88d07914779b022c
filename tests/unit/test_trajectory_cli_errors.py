"""``gyre trajectory`` failures: one line on stderr (what, where, what to do), exit status 2, nothing written."""
import json
import os

import pytest

from gyre_hpc.cli import main
from gyre_hpc.files.io import atomic_write_many

OUTCOME = {"type": "outcome", "run_id": "q0-r0", "query_id": "q0", "status": "scored", "score": 0.5, "t_end": 3.0}


def gyre(capsys, *args):
    """(exit status, stderr lines, stdout) of ``gyre trajectory ARGS``."""
    rc = main(["trajectory", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, err.splitlines(), out


def call(cid="c0", inp=(1, 2), **kw):
    return {"type": "call", "run_id": "q0-r0", "query_id": "q0", "call_id": cid, "input_ids": list(inp),
            "output_ids": [3], "output_logprobs": [-0.5], "version_spans": [[0, 0]], "engine": "e0",
            "finish_reason": "stop", "t_start": 1.0, "t_end": 2.0, **kw}


@pytest.mark.parametrize("action", ["stats", "pack"])
def test_an_empty_log_is_an_error_and_pack_writes_nothing(tmp_path, capsys, action):
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    rc, err, out = gyre(capsys, action, log, *(["--out", tmp_path / "batch"] if action == "pack" else []))
    assert rc == 2 and out == "" and len(err) == 1
    assert err[0].startswith(f"gyre trajectory: error: {log}: no TITO records (the file is empty)")
    assert sorted(os.listdir(tmp_path)) == ["empty.jsonl"]


def test_a_non_utf8_log_is_one_line_naming_file_and_line(tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    log.write_bytes(json.dumps(call()).encode() + b"\n" + b'{"type": "outcome", "run_id": "\xff"}\n')
    rc, err, _ = gyre(capsys, "pack", log, "--out", tmp_path / "batch")
    assert rc == 2 and len(err) == 1 and f"{log}:2: not UTF-8 (byte 0xff at column 32)" in err[0]
    assert not (tmp_path / "batch").exists()


def test_many_problems_fit_on_one_line_with_a_count_of_the_rest(tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    log.write_text("".join(json.dumps(call(cid=f"c{i}", inp=[1, True])) + "\n" for i in range(5)) +
                   json.dumps(OUTCOME) + "\n")
    rc, err, _ = gyre(capsys, "stats", log)
    assert rc == 2 and len(err) == 1
    assert f"{log}:1: call c0 of run q0-r0: input_ids is not a flat list of integers (input_ids[1] is true" in err[0]
    assert err[0].endswith("(and 3 more problem(s)); nothing was read: fix the log (format: docs/tito.md)")


def test_pack_with_no_run_that_trains_is_an_error_and_writes_nothing(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(call()) + "\n" + json.dumps({**OUTCOME, "status": "eval_failure", "score": None}) + "\n")
    rc, err, _ = gyre(capsys, "pack", log, "--out", tmp_path / "batch")
    assert rc == 2 and len(err) == 1 and "no run trains (1 runs: 1 eval_failure" in err[0]
    assert not (tmp_path / "batch").exists()
    assert gyre(capsys, "stats", log)[0] == 0  # counting a log that trains nothing is fine


def test_unwritable_outputs_are_one_line_and_leave_what_was_there(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert gyre(capsys, "synth", "--out", log, "--queries", 2, "--runs", 2)[0] == 0
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    rc, err, _ = gyre(capsys, "pack", log, "--out", blocker)
    assert rc == 2 and err == [f"gyre trajectory: error: {blocker}: cannot write (File exists); nothing was "
                               "written: choose a writable --out"]
    assert blocker.read_text() == "keep me"
    rc, err, _ = gyre(capsys, "synth", "--out", tmp_path)  # a directory
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"gyre trajectory: error: {tmp_path}: cannot write")
    assert sorted(os.listdir(tmp_path)) == ["a-file", "log.jsonl"]  # no temporary left behind


def test_writing_several_files_replaces_none_when_one_fails(tmp_path):
    a, b = tmp_path / "batch.npz", tmp_path / "report.json"
    atomic_write_many({a: b"old a", b: b"old b"})
    with pytest.raises(TypeError):
        atomic_write_many({a: b"new a", b: "not bytes"})
    assert (a.read_bytes(), b.read_bytes()) == (b"old a", b"old b")
    assert sorted(os.listdir(tmp_path)) == ["batch.npz", "report.json"]


@pytest.mark.parametrize("args,needle", [
    (["--queries", 0], "n_queries (--queries) must be >= 1, got 0"),
    (["--runs", -1], "runs_per_query (--runs) must be >= 1, got -1"),
    (["--retry-prob", 2], "retry_prob (--retry-prob) must be in [0, 1], got 2.0"),
    (["--turns", 5, 2], "turns (--turns) must be MIN MAX with 1 <= MIN <= MAX, got (5, 2)"),
])
def test_synth_refuses_knobs_out_of_range_and_writes_nothing(tmp_path, capsys, args, needle):
    rc, err, out = gyre(capsys, "synth", "--out", tmp_path / "log.jsonl", *args)
    assert rc == 2 and out == "" and len(err) == 1 and needle in err[0]
    assert os.listdir(tmp_path) == []
