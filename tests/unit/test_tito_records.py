"""TITO reader/writer: round trip, and every kind of bad input reported with file:line, all at once."""
import json

import numpy as np
import pytest

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoFormatError, read_tito, write_tito
from gyre_hpc.trajectory.synth import synth_log


def call(run="q0-r0", cid="c0", inp=(1, 2, 3), out=(4, 5), **kw):
    rec = {"type": "call", "run_id": run, "query_id": run.split("-")[0], "call_id": cid, "input_ids": list(inp),
           "output_ids": list(out), "output_logprobs": [-0.5] * len(out), "version_spans": [[0, 3]] if out else [],
           "engine": "e0", "finish_reason": "stop", "t_start": 1.0, "t_end": 2.0}
    rec.update(kw)
    return rec


def outcome(run="q0-r0", status="scored", score=0.5, **kw):
    return {"type": "outcome", "run_id": run, "query_id": run.split("-")[0], "status": status, "score": score,
            "t_end": 3.0, **kw}


def write_lines(tmp_path, records):
    p = tmp_path / "log.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return p


def problems(tmp_path, records, **kw):
    with pytest.raises(TitoFormatError) as err:
        read_tito(write_lines(tmp_path, records), **kw)
    return err.value


def test_round_trip_preserves_every_field(tmp_path):
    log = synth_log(3, 2, seed=5, version_change_prob=0.5)
    back = read_tito(write_tito(tmp_path / "a.jsonl", log.calls, log.outcomes))
    assert len(back.calls) == len(log.calls) and back.outcomes == log.outcomes
    for a, b in zip(log.calls, back.calls):
        assert (a.run_id, a.call_id, a.engine, a.finish_reason, a.t_start, a.t_end) == \
               (b.run_id, b.call_id, b.engine, b.finish_reason, b.t_start, b.t_end)
        for f in ("input_ids", "output_ids", "output_logprobs", "output_versions"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert any(len(set(c.output_versions.tolist())) > 1 for c in back.calls)  # version spans were exercised


def test_version_spans_expand_per_output_token(tmp_path):
    log = read_tito(write_lines(tmp_path, [call(out=(4, 5, 6, 7), version_spans=[[0, 2], [3, 5]]), outcome()]))
    assert log.calls[0].output_versions.tolist() == [2, 2, 2, 5]
    assert log.calls[0].line == 1 and log.outcomes[0].line == 2


def test_every_problem_is_listed_with_file_and_line(tmp_path):
    err = problems(tmp_path, [
        call(cid="c0", inp=(1, -2)),                            # 1 negative id
        call(cid="c1", out=(4, 5), output_logprobs=[-1.0]),     # 2 logprob/output mismatch
        {k: v for k, v in call(cid="c2").items() if k != "engine"},  # 3 missing field
        call(cid="c1"),                                         # 4 duplicate call id
        "{not json",                                            # 5
        call(run="q1-r0", cid="c0"),                            # 6 run without outcome
        outcome(),                                              # 7
        outcome(status="eval_failure", score=0.0, run="q2-r0"),  # 8 eval failure with a score
    ], vocab_size=100)
    lines = {line for line, _ in err.problems}
    assert lines == {1, 2, 3, 4, 5, 6, 8}
    text = str(err)
    for line, needle in [(1, "negative id"), (2, "output_logprobs has 1 entries"), (3, "missing field 'engine'"),
                         (4, "duplicate call id c1"), (5, "invalid JSON"), (6, "no outcome record (unfinished)"),
                         (8, "must have score null")]:
        assert any(f"log.jsonl:{line}: " in row and needle in row for row in text.splitlines()), (line, text)


def test_out_of_vocabulary_id_names_the_index(tmp_path):
    err = problems(tmp_path, [call(out=(4, 256, 7)), outcome()], vocab_size=256)
    assert err.problems == [(1, "call c0 of run q0-r0: output_ids has id 256 at index 1, outside the vocabulary "
                                "(size 256)")]
    read_tito(write_lines(tmp_path, [call(out=(4, 256, 7)), outcome()]))  # no vocab given: only negatives fail


def test_empty_input_is_rejected(tmp_path):
    err = problems(tmp_path, [call(inp=()), outcome()])
    assert "input_ids is empty" in str(err)


@pytest.mark.parametrize("bad", [[1.5, 2], [[1], [2]], ["a"], [True, False]])
def test_non_integer_ids_are_rejected(tmp_path, bad):
    err = problems(tmp_path, [call(inp=bad), outcome()])
    assert "input_ids is not a flat list of integers" in str(err)


@pytest.mark.parametrize("spans", [[], [[1, 0]], [[0, 1], [0, 2]], [[0, 1], [2, 1]], [[0, -1]], [0, 1]])
def test_bad_version_spans_are_rejected(tmp_path, spans):
    assert "version_spans" in str(problems(tmp_path, [call(version_spans=spans), outcome()]))


@pytest.mark.parametrize("status,score,needle", [
    ("scored", None, "needs a score in [0, 1]"),
    ("timeout_partial", 1.5, "needs a score in [0, 1]"),
    ("aborted", 0.0, "must have score null"),
    ("done", 1.0, "is not one of scored"),
])
def test_outcome_score_must_match_status(tmp_path, status, score, needle):
    assert needle in str(problems(tmp_path, [call(), outcome(status=status, score=score)]))


def test_a_valid_zero_score_is_kept_as_zero(tmp_path):
    log = read_tito(write_lines(tmp_path, [call(), outcome(score=0)]))
    assert log.outcomes[0].score == 0.0 and log.outcomes[0].status is RunStatus.SCORED


def test_query_ids_and_outcomes_are_cross_checked(tmp_path):
    err = problems(tmp_path, [call(), call(cid="c1", query_id="qX"), outcome(), outcome(score=0.1)])
    assert {line for line, _ in err.problems} == {2, 4}
    assert "duplicate outcome for run q0-r0" in str(err)


def test_bad_file_yields_nothing_and_a_typed_error(tmp_path):
    with pytest.raises(TrajectoryError, match="cannot read TITO log"):
        read_tito(tmp_path / "missing.jsonl")
    with pytest.raises(TrajectoryError, match=r"record type must be 'call' or 'outcome'"):
        read_tito(write_lines(tmp_path, [call(), outcome(), {"type": "note"}]))


def test_write_is_atomic_and_in_memory_calls_serialize(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    c = Call.of("q0-r0", "c0", [1, 2], [3], logprobs=[-0.25], version=7)
    write_tito(target, [c], [Outcome("q0-r0", "q0", RunStatus.SCORED, 1.0)])
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary left behind
    back = read_tito(target)
    assert back.calls[0].output_versions.tolist() == [7] and back.calls[0].output_logprobs.tolist() == [-0.25]


def test_the_documented_example_reads_and_means_what_the_doc_says(tmp_path):
    from pathlib import Path

    from gyre_hpc.trajectory.branches import BranchKind, classify
    from gyre_hpc.trajectory.tree import build_tree

    doc = (Path(__file__).parents[2] / "docs" / "tito.md").read_text()
    block = doc.split("```json\n", 1)[1].split("```", 1)[0]
    log = read_tito(write_lines(tmp_path, block.strip().splitlines()), vocab_size=256)
    c1 = log.runs["q0-r0"][1]
    assert c1.output_versions.tolist() == [4, 4, 5]
    assert log.outcome["q0-r1"].status is RunStatus.EVAL_FAILURE and log.outcome["q0-r1"].score is None
    calls = log.runs["q0-r0"]
    assert [b.kind for b in classify(build_tree(calls), calls)] == [
        BranchKind.ROOT, BranchKind.CONTINUATION, BranchKind.RETRY]


@pytest.mark.parametrize("value", [None, {}, [None], [[1, 2], 3], [2 ** 70], "abc"])
def test_checks_return_messages_instead_of_raising(value):
    from gyre_hpc.trajectory.tito_checks import ids, version_spans

    assert ids(value if isinstance(value, list) else [value], "input_ids", 10)[1]
    assert version_spans(value if isinstance(value, list) else [value], 3)[1]
