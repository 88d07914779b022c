"""Hostile or careless TITO input: each is refused as a typed error naming file, line and field, or read exactly."""
import json

import pytest

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.records import TitoFormatError, read_tito


def call(cid="c0", inp=(1, 2, 3), out=(4, 5), **kw):
    return {"type": "call", "run_id": "q0-r0", "query_id": "q0", "call_id": cid, "input_ids": list(inp),
            "output_ids": list(out), "output_logprobs": [-0.5] * len(out), "version_spans": [[0, 0]],
            "engine": "e0", "finish_reason": "stop", "t_start": 1.0, "t_end": 2.0, **kw}


OUTCOME = {"type": "outcome", "run_id": "q0-r0", "query_id": "q0", "status": "scored", "score": 0.5, "t_end": 3.0}


def log_file(tmp_path, *records, raw: bytes = b""):
    p = tmp_path / "log.jsonl"
    p.write_bytes(raw + "".join(json.dumps(r) + "\n" for r in records).encode())
    return p


def problems_of(path) -> list[tuple[int, str]]:
    with pytest.raises(TitoFormatError) as err:
        read_tito(path)
    return err.value.problems


def test_non_utf8_line_is_a_typed_error_naming_file_and_line(tmp_path):
    path = log_file(tmp_path, call(), OUTCOME, raw=b'{"type": "call", "run_id": "q\xe9"}\n')
    with pytest.raises(TitoFormatError) as err:
        read_tito(path)
    assert err.value.problems == [(1, "not UTF-8 (byte 0xe9 at column 30)")]
    assert f"{path}:1: not UTF-8" in str(err.value)


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_separator_in_a_string_stays_inside_its_record(tmp_path, sep):
    path = tmp_path / "log.jsonl"
    records = [call(finish_reason=f"stop{sep}here"), {**OUTCOME, "detail": f"graded{sep}ok"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    log = read_tito(path)
    assert log.calls[0].finish_reason == f"stop{sep}here" and log.outcomes[0].detail == f"graded{sep}ok"
    assert (log.calls[0].line, log.outcomes[0].line) == (1, 2)


@pytest.mark.parametrize("field", ["input_ids", "output_ids"])
def test_a_boolean_among_token_ids_is_rejected(tmp_path, field):
    bad = call(**{field: [1, True, 3]}, output_logprobs=[-0.5] * 3 if field == "output_ids" else [-0.5] * 2)
    [(line, msg)] = problems_of(log_file(tmp_path, bad, OUTCOME))
    assert line == 1 and msg == f"call c0 of run q0-r0: {field} is not a flat list of integers ({field}[1] is " \
                                "true, a boolean)"


def test_string_logprobs_are_rejected_naming_the_index(tmp_path):
    [(line, msg)] = problems_of(log_file(tmp_path, call(output_logprobs=[-0.5, "-0.1"]), OUTCOME))
    assert line == 1 and msg.endswith('output_logprobs is not a flat list of numbers (output_logprobs[1] is '
                                      '"-0.1", a string)')


@pytest.mark.parametrize("field,literal", [("t_start", "NaN"), ("t_end", "Infinity"), ("t_start", "-Infinity"),
                                           ("t_end", "1e999")])
def test_non_finite_call_times_are_rejected_naming_the_field(tmp_path, field, literal):
    text = json.dumps(call(**{field: 123.0})).replace("123.0", literal)
    path = log_file(tmp_path, OUTCOME, raw=text.encode() + b"\n")
    assert problems_of(path) == [(1, f"call c0 of run q0-r0: field {field!r} must be a finite number, got "
                                     f"{float(literal)!r}")]


def test_an_integer_time_too_large_for_a_float_is_rejected(tmp_path):
    huge = 10 ** 400
    [(line, msg)] = problems_of(log_file(tmp_path, call(t_end=huge), OUTCOME))
    assert line == 1 and msg.startswith("call c0 of run q0-r0: field 't_end' must be a finite number, got 1000")


def test_non_finite_outcome_time_and_score_are_rejected(tmp_path):
    text = json.dumps({**OUTCOME, "t_end": 1.5, "score": 0.25}).replace("1.5", "NaN").replace("0.25", "Infinity")
    path = log_file(tmp_path, call(), raw=text.encode() + b"\n")
    msgs = [m for _, m in problems_of(path)]
    assert msgs == ["outcome of run q0-r0: field 'score' must be a finite number, got inf",
                    "outcome of run q0-r0: field 't_end' must be a finite number, got nan"]


def test_one_line_message_shows_the_first_problems_and_counts_the_rest(tmp_path):
    path = log_file(tmp_path, call(cid="a", inp=[True]), call(cid="b", inp=[-1]), call(cid="c", inp=[]), OUTCOME)
    with pytest.raises(TitoFormatError) as err:
        read_tito(path)
    line = err.value.one_line()
    assert "\n" not in line and line.startswith(f"{path}:1: call a of run q0-r0: input_ids is not a flat list")
    assert f"; {path}:2: call b" in line and "(and 1 more problem(s)); nothing was read: fix the log" in line


def test_an_empty_file_reads_as_an_empty_log(tmp_path):
    log = read_tito(log_file(tmp_path))
    assert log.calls == () and log.outcomes == ()


def test_a_directory_is_a_typed_error(tmp_path):
    with pytest.raises(TrajectoryError, match=rf"{tmp_path}: cannot read TITO log"):
        read_tito(tmp_path)
