"""The one JSONL reader: every JSON-lines file gyre_hpc reads back (TITO logs, traces, run records) goes through it.

::

    bytes ──split on b"\\n" only──▶ line n ──strict UTF-8──▶ text ──json.loads──▶ value   (n from 1)
                                           └ problem "not UTF-8 (byte 0xff at column 3)"
                                                             └ problem "invalid JSON (... at column 7)"

Rules (each has a test in tests/unit/test_jsonl_reader.py)
- Lines end at ``\\n`` and nowhere else. U+2028, U+2029 and U+0085 are legal inside JSON strings and stay there
  (``str.splitlines`` would cut the record in two); a ``\\r`` before the ``\\n`` is JSON whitespace.
- Each line is decoded as strict UTF-8 on its own: a bad byte is a problem of that line (file, line, column),
  never a ``UnicodeDecodeError``, and the other lines still parse.
- A line that is not JSON, nested too deeply for the parser, or holds an integer too long to convert, is a
  problem of that line, never a ``ValueError`` or ``RecursionError``.
- Blank lines are skipped; line numbers are physical lines of the file, so ``file:line`` points at the record.
- ``torn_tail=True`` (logs appended by a process that may be killed mid-write): a last line without ``\\n`` is a
  torn write and is dropped. Otherwise it is an ordinary line.
- An unreadable file (missing, a directory, no permission) raises the caller's error type naming the file; the
  reader never raises anything but that type.
- ``NaN``/``Infinity`` parse as Python's ``json`` parses them; a schema that needs finite numbers checks them and
  names the field (``trajectory/tito_checks.py``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gyre_hpc.errors import GyreError


@dataclass(frozen=True)
class Line:
    """One non-blank line: its 1-based number and either its value or what is wrong with it."""

    number: int
    value: Any = None
    problem: str = ""  # "" when ``value`` was parsed


def _parse(raw: bytes, number: int) -> Line:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Line(number, problem=f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
    try:
        return Line(number, json.loads(text))
    except json.JSONDecodeError as exc:
        return Line(number, problem=f"invalid JSON ({exc.msg} at column {exc.colno})")
    except RecursionError:
        return Line(number, problem="invalid JSON (nested too deeply)")
    except ValueError as exc:  # e.g. an integer literal longer than Python converts
        return Line(number, problem=f"invalid JSON ({exc})")


def scan(path: str | Path, error: type[GyreError] = GyreError, *, torn_tail: bool = False,
         comments: bool = False, what: str = "JSONL file") -> Iterator[Line]:
    """Every non-blank line of ``path`` in order, parsed or with its problem; ``error`` if the file can't be read.

    ``comments=True`` also skips lines whose first non-blank character is ``#`` (hand-written traces).
    """
    try:
        with open(path, "rb") as f:
            prev: bytes | None = None
            number = 0
            for raw in f:  # binary iteration splits on b"\n" only
                if prev is not None and _wanted(prev, comments):
                    yield _parse(prev, number)
                prev, number = raw, number + 1
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise error(f"{path}: cannot read {what} ({why}); check the path and its permissions") from None
    if prev is not None and _wanted(prev, comments) and not (torn_tail and not prev.endswith(b"\n")):
        yield _parse(prev, number)


def _wanted(raw: bytes, comments: bool) -> bool:
    stripped = raw.strip()
    return bool(stripped) and not (comments and stripped.startswith(b"#"))


def read_objects(path: str | Path, error: type[GyreError] = GyreError, *, torn_tail: bool = False,
                 comments: bool = False, what: str = "JSONL file") -> list[tuple[int, dict]]:
    """``(line number, object)`` per line (options as ``scan``); the first bad line raises
    ``error("file:line: problem")``."""
    out = []
    for line in scan(path, error, torn_tail=torn_tail, comments=comments, what=what):
        if line.problem:
            raise error(f"{path}:{line.number}: {line.problem}")
        if not isinstance(line.value, dict):
            raise error(f"{path}:{line.number}: expected a JSON object, got {json.dumps(line.value)[:60]}")
        out.append((line.number, line.value))
    return out

