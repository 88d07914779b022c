"""Integrity of a group's TITO file: does it hold what the proxy served and the harness saw? Pure (numpy).

A live group's file (``tito/q<gid>.jsonl``) is written by the proxy's flush. Before it trains, three accounts
of each run must agree::

    harness   the outcome it decided, the calls it got answers for (call id → output ids)
    proxy     per run: calls recorded and their output tokens, since the start (``flush`` → ``served``)
    file      the call and outcome records read back (``read_tito``)

``check_group`` lists every disagreement; a group with any is *lost* (never trained), and the runtime counts it,
logs it and reports it (``live.dataloss``).

Invariants (tests/unit/test_tito_integrity.py)
- A group passes only if its file holds exactly the group's runs, each with exactly one outcome equal to the
  harness's (status and score), as many calls and output tokens as the proxy served for it, and every call the
  harness got an answer for, with the same output ids.
- Every problem names the run (and the call) and both numbers; the check never raises on a bad file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from gyre_hpc.trajectory.records import Call, Outcome, TitoLog


@dataclass(frozen=True)
class Served:
    """What the proxy recorded for one run: calls and their output tokens."""

    calls: int
    output_tokens: int


def check_group(log: TitoLog, outcomes: Sequence[Outcome], served: Mapping[str, Served],
                seen: Mapping[str, Sequence[Call]] | None = None) -> list[str]:
    """The problems of ``log`` (one group's file) against the harness's ``outcomes`` and ``seen`` calls and the
    proxy's ``served`` counts; empty when the group may train."""
    problems: list[str] = []
    expected = {o.run_id: o for o in outcomes}
    foreign = sorted(({c.run_id for c in log.calls} | {o.run_id for o in log.outcomes}) - set(expected))
    if foreign:
        problems.append(f"records of run(s) not in the group: {', '.join(foreign)}")
    in_file: dict[str, list[Outcome]] = {}
    for o in log.outcomes:
        in_file.setdefault(o.run_id, []).append(o)
    runs = log.runs
    for run_id, want in expected.items():
        got = in_file.get(run_id, [])
        if len(got) != 1:
            problems.append(f"run {run_id}: {len(got)} outcome record(s) in the file, expected 1")
        elif (got[0].status, got[0].score) != (want.status, want.score):
            problems.append(f"run {run_id}: outcome {got[0].status.value}/{got[0].score} in the file, the harness "
                            f"decided {want.status.value}/{want.score}")
        calls = runs.get(run_id, ())
        problems += _served(run_id, calls, served.get(run_id))
        problems += _seen(run_id, calls, (seen or {}).get(run_id, ()))
    return problems


def _served(run_id: str, calls: Sequence[Call], served: Served | None) -> list[str]:
    if served is None:
        return [f"run {run_id}: the proxy reported no count of its calls"]
    tokens = sum(len(c.output_ids) for c in calls)
    out = []
    if len(calls) != served.calls:
        out.append(f"run {run_id}: {len(calls)} call record(s) in the file, the proxy served {served.calls}")
    if tokens != served.output_tokens:
        out.append(f"run {run_id}: {tokens} output token(s) in the file, the proxy served {served.output_tokens}")
    return out


def _seen(run_id: str, calls: Sequence[Call], seen: Sequence[Call]) -> list[str]:
    by_id = {c.call_id: c for c in calls}
    out = []
    for s in seen:
        c = by_id.get(s.call_id)
        if c is None:
            out.append(f"run {run_id}: call {s.call_id} answered to the harness is not in the file")
        elif not np.array_equal(c.output_ids, s.output_ids):
            out.append(f"run {run_id}: call {s.call_id} has {len(c.output_ids)} output token(s) in the file, the "
                       f"harness got {len(s.output_ids)}" + ("" if len(c.output_ids) != len(s.output_ids)
                                                              else " (different ids)"))
    return out
