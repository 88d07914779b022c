"""The one JSONL reader (gyre_hpc/files/jsonl.py): lines end at \\n only, bad bytes and bad JSON are per-line problems."""
import json

import pytest

from gyre_hpc.errors import GyreError, WorkloadError
from gyre_hpc.files.jsonl import read_objects, scan


def write(tmp_path, data: bytes):
    p = tmp_path / "x.jsonl"
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c"])
def test_unicode_line_separators_inside_strings_do_not_split_records(tmp_path, sep):
    text = json.dumps({"s": f"a{sep}b"}, ensure_ascii=False) + "\n" + json.dumps({"s": "c"}) + "\n"
    lines = list(scan(write(tmp_path, text.encode())))
    assert [(x.number, x.value) for x in lines] == [(1, {"s": f"a{sep}b"}), (2, {"s": "c"})]


def test_crlf_line_endings_read_as_records(tmp_path):
    assert read_objects(write(tmp_path, b'{"a": 1}\r\n{"a": 2}\r\n')) == [(1, {"a": 1}), (2, {"a": 2})]


def test_non_utf8_line_is_a_problem_of_that_line_and_the_others_still_parse(tmp_path):
    lines = list(scan(write(tmp_path, b'{"a": 1}\n{"b": "\xff\xfe"}\n{"a": 3}\n')))
    assert [x.value for x in lines] == [{"a": 1}, None, {"a": 3}]
    assert lines[1].number == 2 and lines[1].problem == "not UTF-8 (byte 0xff at column 8)"


def test_bad_json_deep_nesting_and_huge_integers_are_problems_not_exceptions(tmp_path):
    data = b'{"a": \n' + b"[" * 100_000 + b"]" * 100_000 + b"\n" + b'{"n": ' + b"9" * 5000 + b"}\n"
    problems = [(x.number, x.problem.split(" (")[0]) for x in scan(write(tmp_path, data))]
    assert problems == [(1, "invalid JSON"), (2, "invalid JSON"), (3, "invalid JSON")]


def test_blank_lines_are_skipped_but_keep_the_physical_line_numbers(tmp_path):
    assert read_objects(write(tmp_path, b'\n  \n{"a": 1}\n\n{"a": 2}')) == [(3, {"a": 1}), (5, {"a": 2})]


def test_a_last_line_without_newline_is_kept_unless_it_may_be_torn(tmp_path):
    p = write(tmp_path, b'{"a": 1}\n{"a": 2}')
    assert [n for n, _ in read_objects(p)] == [1, 2]
    assert [n for n, _ in read_objects(p, torn_tail=True)] == [1]
    torn = write(tmp_path, b'{"a": 1}\n{"a": ')
    assert read_objects(torn, torn_tail=True) == [(1, {"a": 1})]


def test_comment_lines_are_skipped_only_when_asked(tmp_path):
    p = write(tmp_path, b'# a trace\n{"a": 1}\n')
    assert read_objects(p, comments=True) == [(2, {"a": 1})]
    with pytest.raises(GyreError, match=r"x.jsonl:1: invalid JSON"):
        read_objects(p)


def test_read_objects_raises_the_callers_error_type_naming_file_and_line(tmp_path):
    with pytest.raises(WorkloadError, match=r"x.jsonl:2: expected a JSON object, got \[1, 2\]"):
        read_objects(write(tmp_path, b'{"a": 1}\n[1, 2]\n'), WorkloadError)
    with pytest.raises(WorkloadError, match=r"x.jsonl:1: not UTF-8"):
        read_objects(write(tmp_path, b'{"a": "\xc3"}\n'), WorkloadError)


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["missing", "directory"])
def test_unreadable_file_is_one_typed_error_naming_it(tmp_path, make):
    path = tmp_path / "log.jsonl"
    make(path)
    with pytest.raises(WorkloadError, match=rf"{path}: cannot read trace \(.+\); check the path"):
        list(scan(path, WorkloadError, what="trace"))
