"""Checks of TITO records (used by ``records.read_tito``): each returns the problems it finds as messages.

Invariants
- A check never raises on malformed input; it returns a message naming the field (and the index for ids).
- JSON ``true``/``false`` is never a number: not a token id, a logprob, a time or a score (Python's ``bool`` is
  an ``int``, so each check looks at the exact type). Strings are never numbers either.
- Number fields are finite: ``NaN`` and ``Infinity`` (which Python's ``json`` accepts) are rejected by name.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

CALL_FIELDS = {"run_id": str, "query_id": str, "call_id": str, "input_ids": list, "output_ids": list,
               "output_logprobs": list, "version_spans": list, "engine": str, "finish_reason": str,
               "t_start": (int, float), "t_end": (int, float)}
OUTCOME_FIELDS = {"run_id": str, "query_id": str, "status": str, "score": (int, float, type(None)),
                  "t_end": (int, float)}
OUTCOME_OPTIONAL = {"detail": str}


def fields(rec: dict, spec: dict, optional: dict, what: str) -> list[str]:
    """Missing, mistyped (a bool is not a number), non-finite (NaN, Infinity) and unknown fields."""
    errs = [f"{what}: missing field {k!r}" for k in spec if k not in rec]
    for k, tp in {**spec, **optional}.items():
        v = rec.get(k)
        if k in rec and (not isinstance(v, tp) or isinstance(v, bool)):
            errs.append(f"{what}: field {k!r} has the wrong type ({type(v).__name__}: {v!r:.40})")
        elif isinstance(v, (int, float)) and not _finite(v):
            errs.append(f"{what}: field {k!r} must be a finite number, got {v!r:.40}")
    unknown = sorted(set(rec) - set(spec) - set(optional) - {"type"})
    if unknown:
        errs.append(f"{what}: unknown field(s) {', '.join(unknown)}")
    return errs


def _finite(v: int | float) -> bool:
    """Finite as a float (an integer too large for a float is not)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def ids(values: list, name: str, vocab_size: int | None) -> tuple[np.ndarray, list[str]]:
    """Token ids as int64, and what is wrong with them (not integers, negative, out of vocabulary)."""
    bad = _first_not(values, (int,))
    if bad is not None:
        return np.zeros(0, np.int64), [f"{name} is not a flat list of integers ({name}{bad})"]
    try:
        arr = np.asarray(values, np.int64) if values else np.zeros(0, np.int64)
    except (ValueError, OverflowError):
        return np.zeros(0, np.int64), [f"{name} is not a flat list of integers (an id does not fit in 64 bits)"]
    errs = []
    if arr.size and arr.min() < 0:
        errs.append(f"{name} has a negative id ({int(arr.min())}) at index {int(np.argmax(arr < 0))}")
    if vocab_size is not None and arr.size and arr.max() >= vocab_size:
        bad = int(np.argmax(arr >= vocab_size))
        errs.append(f"{name} has id {int(arr[bad])} at index {bad}, outside the vocabulary (size {vocab_size})")
    return arr, errs


def logprobs(values: list, n_out: int) -> tuple[np.ndarray, list[str]]:
    """Output logprobs as float64: one per output token, numbers (not strings, not bools), finite and <= 0."""
    if len(values) != n_out:
        return np.zeros(0), [f"output_logprobs has {len(values)} entries, output_ids has {n_out}"]
    bad = _first_not(values, (int, float))
    if bad is not None:
        return np.zeros(0), [f"output_logprobs is not a flat list of numbers (output_logprobs{bad})"]
    arr = np.asarray(values, np.float64).reshape(n_out)
    if not np.all(np.isfinite(arr)) or np.any(arr > 1e-6):
        return np.zeros(0), ["output_logprobs must be finite and <= 0"]
    return arr, []


def _first_not(values: list, types: tuple[type, ...]) -> str | None:
    """``"[i] is <json> (a <kind>)"`` for the first value whose exact type is not one of ``types``, else None."""
    if set(map(type, values)) <= set(types):  # one pass in C; the loop below runs only for a bad list
        return None
    i, v = next((i, v) for i, v in enumerate(values) if type(v) not in types)
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", float: "a fraction",
            type(None): "null"}.get(type(v), type(v).__name__)
    return f"[{i}] is {json.dumps(v)[:24]}, {kind}"


def version_spans(spans: list, n_out: int) -> tuple[np.ndarray, list[str]]:
    """``[[start, version], ...]`` expanded to one version per output token, or the problem."""
    msg = "version_spans must be [[start, version], ...] with starts 0, increasing, < len(output_ids)"
    try:
        arr = np.asarray(spans, dtype=np.int64).reshape(-1, 2) if spans else np.zeros((0, 2), np.int64)
        exact = all(isinstance(x, int) and not isinstance(x, bool) for s in spans for x in s)
    except (ValueError, TypeError, OverflowError):
        return np.zeros(0, np.int64), [msg]
    starts, versions = arr[:, 0], arr[:, 1]
    if not exact or len(arr) != len(spans) or (n_out and not len(arr)) or (len(arr) and (
            starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= max(n_out, 1) or versions.min() < 0)):
        return np.zeros(0, np.int64), [msg]
    lengths = np.diff(np.append(starts, n_out)) if n_out else np.zeros(len(arr), np.int64)
    return np.repeat(versions, lengths), []


def header(rec: Any, line: int) -> tuple[int, str, str, str, str] | None:
    """(line, type, run id, query id, call id) of a record whose ids are readable, for the cross checks."""
    if not isinstance(rec, dict) or rec.get("type") not in ("call", "outcome"):
        return None
    ids = [rec.get(k, "") for k in ("run_id", "query_id", "call_id")]
    return (line, rec["type"], *ids) if all(isinstance(i, str) for i in ids) and ids[0] else None


def cross_check(headers: list[tuple[int, str, str, str, str]]) -> list[tuple[int, str]]:
    """Duplicate call ids and outcomes, query ids that disagree within a run, runs without an outcome."""
    problems = []
    calls: dict[tuple[str, str], int] = {}
    query: dict[str, tuple[str, int]] = {}
    outcomes: dict[str, int] = {}
    for line, kind, run, qid, cid in headers:
        if kind == "call" and (run, cid) in calls:
            problems.append((line, f"duplicate call id {cid} in run {run} (first at line {calls[run, cid]})"))
        elif kind == "outcome" and run in outcomes:
            problems.append((line, f"duplicate outcome for run {run} (first at line {outcomes[run]})"))
        if kind == "call":
            calls.setdefault((run, cid), line)
        else:
            outcomes.setdefault(run, line)
        first_q, first_line = query.setdefault(run, (qid, line))
        if qid != first_q:
            problems.append((line, f"{kind} of run {run}: query id {qid} differs from {first_q} (line {first_line})"))
    first_call: dict[str, int] = {}
    for line, kind, run, _, _ in headers:
        if kind == "call":
            first_call.setdefault(run, line)
    problems += [(line, f"run {run} has calls but no outcome record (unfinished)")
                 for run, line in first_call.items() if run not in outcomes]
    return problems
