"""TITO records: one JSON line per model call (token in / token out) and one per finished run (its outcome).

The format is documented in ``docs/tito.md``. A call line::

    {"type": "call", "run_id": "q0-r1", "query_id": "q0", "call_id": "c3",
     "input_ids": [1, 5, 9], "output_ids": [7, 2], "output_logprobs": [-0.1, -2.3],
     "version_spans": [[0, 4]], "engine": "sglang-0", "finish_reason": "stop", "t_start": 1.0, "t_end": 2.5}

An outcome line::

    {"type": "outcome", "run_id": "q0-r1", "query_id": "q0", "status": "scored", "score": 0.5, "t_end": 9.0}

Invariants
- ``read_tito`` returns all of a file or nothing: it collects every problem (bad JSON, missing or mistyped
  fields, negative or out-of-vocabulary ids, logprob/output length mismatch, bad version spans, an empty input,
  duplicate call ids within a run, duplicate outcomes, a query id that disagrees with the run's, a run with calls
  but no outcome) and raises one ``TitoFormatError`` listing each as ``file:line: message``.
- Lines are read by the one JSONL reader (``gyre_hpc.files.jsonl``): they end at ``\n`` only (U+2028, U+2029 and
  U+0085 inside strings are content), and a line that is not UTF-8 is a problem of that line, like bad JSON.
- Token ids are JSON integers (``true`` is not 1), logprobs are numbers (``"-0.1"`` is not), and every number
  is finite (``NaN`` and ``Infinity`` are rejected naming the field).
- An empty file reads as an empty log (a group whose runs made no call flushes one); commands that need records
  refuse it themselves (``jobs/trajectory.py``).
- A score is in [0, 1] and present exactly for ``scored`` and ``timeout_partial``; the other statuses carry
  ``null``, so an evaluation failure can never be read as a score of 0.
- Calls keep file order (the order the proxy finished them); ``write_tito`` writes atomically and
  ``read_tito(write_tito(x)) == x``.
"""
from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.files.jsonl import scan
from gyre_hpc.trajectory.tito_checks import (CALL_FIELDS, OUTCOME_FIELDS, OUTCOME_OPTIONAL, cross_check,
                                                fields, header, ids, logprobs, version_spans)


class RunStatus(str, enum.Enum):
    SCORED = "scored"  # finished and graded: score in [0, 1] (0 is a valid score and trains)
    TIMEOUT_PARTIAL = "timeout_partial"  # timed out; partial work was graded: trains with its partial score
    TIMEOUT_UNSCORABLE = "timeout_unscorable"  # timed out with nothing gradable: excluded
    EVAL_FAILURE = "eval_failure"  # the grader crashed or was unavailable: excluded, never a 0
    ABORTED = "aborted"  # stopped by the system: excluded

    @property
    def has_score(self) -> bool:
        return self in (RunStatus.SCORED, RunStatus.TIMEOUT_PARTIAL)


@dataclass(frozen=True, eq=False)
class Call:
    """One model call. ``output_versions[i]`` is the policy version that generated ``output_ids[i]``."""

    run_id: str
    query_id: str
    call_id: str
    input_ids: np.ndarray  # int64 [n_in], n_in >= 1
    output_ids: np.ndarray  # int64 [n_out]
    output_logprobs: np.ndarray  # float64 [n_out]
    output_versions: np.ndarray  # int64 [n_out]
    engine: str = ""
    finish_reason: str = ""
    t_start: float = 0.0
    t_end: float = 0.0
    line: int = 0  # 1-based line in the file it was read from (0 when built in memory)

    @property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.input_ids, self.output_ids])

    @classmethod
    def of(cls, run_id: str, call_id: str, input_ids: Any, output_ids: Any, *, query_id: str | None = None,
           logprobs: Any = None, version: int = 0, **kw: Any) -> "Call":
        """A call built in memory (tests, synthesis); logprobs default to -1.0, one version for the output."""
        out = np.asarray(output_ids, np.int64).reshape(-1)
        lp = np.full(len(out), -1.0) if logprobs is None else np.asarray(logprobs, np.float64)
        return cls(run_id, query_id if query_id is not None else run_id.split("-")[0], call_id,
                   np.asarray(input_ids, np.int64).reshape(-1), out, lp, np.full(len(out), version, np.int64), **kw)


@dataclass(frozen=True)
class Outcome:
    run_id: str
    query_id: str
    status: RunStatus
    score: float | None
    t_end: float = 0.0
    detail: str = ""
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, eq=False)
class TitoLog:
    calls: tuple[Call, ...]
    outcomes: tuple[Outcome, ...]
    source: str = "<memory>"

    @cached_property
    def runs(self) -> dict[str, tuple[Call, ...]]:
        """run id → its calls in file order; runs with an outcome but no call map to ``()``."""
        out: dict[str, list[Call]] = {o.run_id: [] for o in self.outcomes}
        for c in self.calls:
            out.setdefault(c.run_id, []).append(c)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def outcome(self) -> dict[str, Outcome]:
        return {o.run_id: o for o in self.outcomes}


class TitoFormatError(TrajectoryError):
    """A TITO file with problems; ``problems`` lists ``(line, message)`` and the message shows each."""

    def __init__(self, source: str, problems: list[tuple[int, str]]):
        self.source = source
        self.problems = sorted(problems)
        listed = "\n".join(f"  {source}:{line}: {msg}" for line, msg in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s), no samples were produced:\n{listed}")

    def one_line(self, shown: int = 2) -> str:
        """The first ``shown`` problems and the count of the rest, on one line (the command line's message)."""
        rows = [f"{self.source}:{line}: {msg}".replace("\n", "\\n") for line, msg in self.problems[:shown]]
        first = "; ".join(rows)
        more = len(self.problems) - shown
        rest = f" (and {more} more problem(s))" if more > 0 else ""
        return f"{first}{rest}; nothing was read: fix the log (format: docs/tito.md)"


def _parse_call(rec: dict, line: int, vocab_size: int | None) -> tuple[Call | None, list[str]]:
    what = f"call {rec.get('call_id', '?')} of run {rec.get('run_id', '?')}"
    errs = fields(rec, CALL_FIELDS, {}, what)
    if errs:
        return None, errs
    inp, e1 = ids(rec["input_ids"], "input_ids", vocab_size)
    out, e2 = ids(rec["output_ids"], "output_ids", vocab_size)
    errs = [f"{what}: {e}" for e in e1 + e2]
    if not e1 and inp.size == 0:
        errs.append(f"{what}: input_ids is empty (the first token of a path has nothing to be predicted from)")
    lp, e3 = logprobs(rec["output_logprobs"], len(rec["output_ids"]))
    versions, e4 = version_spans(rec["version_spans"], len(rec["output_ids"]))
    errs += [f"{what}: {e}" for e in e3 + e4]
    if rec["t_end"] < rec["t_start"]:
        errs.append(f"{what}: t_end {rec['t_end']} is before t_start {rec['t_start']}")
    if errs:
        return None, errs
    return Call(rec["run_id"], rec["query_id"], rec["call_id"], inp, out, lp, versions, rec["engine"],
                rec["finish_reason"], float(rec["t_start"]), float(rec["t_end"]), line), []


def _parse_outcome(rec: dict, line: int) -> tuple[Outcome | None, list[str]]:
    what = f"outcome of run {rec.get('run_id', '?')}"
    errs = fields(rec, OUTCOME_FIELDS, OUTCOME_OPTIONAL, what)
    if errs:
        return None, errs
    try:
        status = RunStatus(rec["status"])
    except ValueError:
        return None, [f"{what}: status {rec['status']!r} is not one of {', '.join(s.value for s in RunStatus)}"]
    score = rec["score"]
    if status.has_score and (score is None or not 0.0 <= score <= 1.0 or math.isnan(score)):
        return None, [f"{what}: status {status.value} needs a score in [0, 1], got {score!r}"]
    if not status.has_score and score is not None:
        return None, [f"{what}: status {status.value} must have score null (got {score!r}); it is not a 0"]
    return Outcome(rec["run_id"], rec["query_id"], status, None if score is None else float(score),
                   float(rec["t_end"]), rec.get("detail", ""), line), []


def read_tito(path: str | Path, vocab_size: int | None = None) -> TitoLog:
    """Read and validate a TITO JSONL file; raise ``TitoFormatError`` listing every problem."""
    source = str(path)
    calls, outcomes, problems, headers = [], [], [], []
    for parsed in scan(path, TrajectoryError, what="TITO log"):
        line, rec = parsed.number, parsed.value
        if parsed.problem:
            problems.append((line, parsed.problem))
            continue
        headers += [h for h in [header(rec, line)] if h]
        kind = rec.get("type") if isinstance(rec, dict) else None
        if kind == "call":
            item, errs = _parse_call(rec, line, vocab_size)
            calls += [item] if item else []
        elif kind == "outcome":
            item, errs = _parse_outcome(rec, line)
            outcomes += [item] if item else []
        else:
            errs = [f"record type must be 'call' or 'outcome', got {kind!r}"]
        problems += [(line, e) for e in errs]
    problems += cross_check(headers)
    if problems:
        raise TitoFormatError(source, problems)
    return TitoLog(tuple(calls), tuple(outcomes), source)


def call_record(c: Call) -> dict[str, Any]:
    change = np.flatnonzero(np.diff(c.output_versions)) + 1
    starts = np.concatenate([[0], change]) if len(c.output_versions) else np.zeros(0, np.int64)
    return {"type": "call", "run_id": c.run_id, "query_id": c.query_id, "call_id": c.call_id,
            "input_ids": c.input_ids.tolist(), "output_ids": c.output_ids.tolist(),
            "output_logprobs": np.asarray(c.output_logprobs, np.float64).tolist(),
            "version_spans": [[int(s), int(c.output_versions[s])] for s in starts],
            "engine": c.engine, "finish_reason": c.finish_reason, "t_start": c.t_start, "t_end": c.t_end}


def outcome_record(o: Outcome) -> dict[str, Any]:
    rec = {"type": "outcome", "run_id": o.run_id, "query_id": o.query_id, "status": RunStatus(o.status).value,
           "score": o.score, "t_end": o.t_end}
    return {**rec, "detail": o.detail} if o.detail else rec


def write_tito(path: str | Path, calls: Iterable[Call], outcomes: Iterable[Outcome]) -> Path:
    """Write calls (in order), then outcomes, as JSONL; atomically (temporary sibling, then rename)."""
    lines = [json.dumps(call_record(c), separators=(",", ":")) for c in calls]
    lines += [json.dumps(outcome_record(o), separators=(",", ":")) for o in outcomes]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))
