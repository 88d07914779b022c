"""TITO recording: the proxy buffers one ``Call`` per finished harness call and flushes them to a JSONL file.

Outcomes are decided by the harness (grader, timeouts); it either writes them itself or posts them to the
proxy (``POST /tito/outcome``), in which case they are flushed with the calls into the same file, so one
step's file is complete for ``read_tito``. A flush may carry the runs' outcomes itself (the live runtime's
group flush does): then the file has every outcome whatever happened to the posts.

Invariants (tests/unit/test_proxy_recording.py)
- Call ids are unique within a run: a ``(run_id, call_id)`` in flight or buffered is refused (``ProxyError``
  409); a call that failed releases its id, a flushed call releases it too (the file it went to has it).
- ``flush`` moves the selected runs' records (all runs by default) from the buffer to the file, calls in the
  order they finished, then outcomes; records of other runs stay buffered. The file is appended to atomically:
  old content + new lines go to a temporary sibling that replaces it (``gyre_hpc.files.io``), so a reader never sees
  a torn line and a failed (or refused) flush leaves the buffer and the file unchanged.
- A run is *closed* once its outcome is in a file: its outcome is written exactly once. An identical outcome
  posted again (a retried post, or one that arrives after the flush that carried it) is accepted and changes
  nothing; a different one is refused (409). A call of a closed run is never buffered: ``reserve`` refuses a
  new one (409) and ``add_call`` drops one that was in flight at the flush (a *late* call, returns False).
- ``flush(..., outcomes=...)`` writes only if every selected run then has exactly one outcome, each equal to
  the given one, and none was closed before (else 409, nothing written).
- ``served`` counts, per run not yet closed, the calls recorded and their output tokens since the start
  (whichever file they went to): what the proxy served, for the reader's integrity check.
- A flush writes only to ``<tito_dir>/<name>``: ``name`` is a plain file name (``FILE_NAME``, no directory part)
  and neither the file nor its directory may be a symbolic link; the request never gives a path.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, call_record, outcome_record


#: what ``/admin/flush_tito`` accepts as a file name inside the run's TITO directory
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.jsonl")


def group_file(gid: int) -> str:
    """The TITO file name of group ``gid`` (``q00007.jsonl``)."""
    return f"q{gid:05d}.jsonl"


def tito_file(tito_dir: str | Path | None, name: object) -> Path:
    """``tito_dir / name`` once ``name`` is a plain file name there (a ``ProxyError`` otherwise)."""
    if tito_dir is None:
        raise ProxyError("name: this proxy has no TITO directory (proxy.tito_dir); it flushes nowhere", 409)
    if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
        raise ProxyError(f"name: expected a file name like q00001.jsonl (letters, digits, _ and -), got {name!r}")
    folder = Path(tito_dir)
    path = folder / name
    if folder.is_symlink() or path.is_symlink():
        raise ProxyError(f"name: {path} is a symbolic link; the proxy writes only plain files in {folder}", 409)
    return path


class TitoRecorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.outcomes: list[Outcome] = []
        self._ids: set[tuple[str, str]] = set()
        self.closed: dict[str, str] = {}  # run id -> the file its outcome went to
        self._closed_outcome: dict[str, Outcome] = {}
        self.served: dict[str, list[int]] = {}  # run id -> [calls, output tokens] recorded (open runs)

    def reserve(self, run_id: str, call_id: str) -> None:
        if run_id in self.closed:
            raise ProxyError(f"rid: run {run_id!r} has ended (its outcome is in {self.closed[run_id]}); "
                             f"call {call_id!r} is refused", 409)
        if (run_id, call_id) in self._ids:
            raise ProxyError(f"rid: call {call_id!r} of run {run_id!r} was already sent (call ids are unique "
                             f"within a run)", 409)
        self._ids.add((run_id, call_id))

    def unreserve(self, run_id: str, call_id: str) -> None:
        self._ids.discard((run_id, call_id))

    def add_call(self, call: Call) -> bool:
        """Buffer a finished call; False (nothing buffered) for a late call of a closed run."""
        if call.run_id in self.closed:
            self._ids.discard((call.run_id, call.call_id))
            return False
        self.calls.append(call)
        served = self.served.setdefault(call.run_id, [0, 0])
        served[0] += 1
        served[1] += len(call.output_ids)
        return True

    def add_outcome(self, outcome: Outcome) -> bool:
        """Buffer a run's outcome; False if this very outcome is already buffered or written (nothing changes)."""
        _check_score(outcome)
        known = self._outcome_of(outcome.run_id)
        if known is not None:
            if known == outcome:
                return False
            where = f"written to {self.closed[outcome.run_id]}" if outcome.run_id in self.closed else "buffered"
            raise ProxyError(f"run_id: run {outcome.run_id!r} already has a different outcome ({where})", 409)
        self.outcomes.append(outcome)
        return True

    def _outcome_of(self, run_id: str) -> Outcome | None:
        if run_id in self._closed_outcome:
            return self._closed_outcome[run_id]
        return next((o for o in self.outcomes if o.run_id == run_id), None)

    def pending(self) -> dict[str, int]:
        return {"calls": len(self.calls), "outcomes": len(self.outcomes)}

    def flush(self, path: str | Path, run_ids: Iterable[str] | None = None,
              outcomes: Iterable[Outcome] | None = None) -> dict:
        """Append the selected runs' buffered records to ``path``; returns what was written, with ``served``
        (the selected runs' recorded calls and output tokens) and ``recovered`` (runs whose outcome only the
        flush brought). With ``outcomes``, refuse (409, nothing written) unless each selected run ends up with
        exactly that outcome."""
        wanted = None if run_ids is None else list(dict.fromkeys(run_ids))
        take = (lambda r: True) if wanted is None else set(wanted).__contains__
        recovered = [] if outcomes is None else self._check_flush(wanted, list(outcomes))
        calls = [c for c in self.calls if take(c.run_id)]
        written = [o for o in self.outcomes if take(o.run_id)] + recovered
        lines = [json.dumps(call_record(c), separators=(",", ":")) for c in calls]
        lines += [json.dumps(outcome_record(o), separators=(",", ":")) for o in written]
        path = Path(path)
        try:
            old = path.read_text() if path.exists() else ""
        except OSError as exc:
            raise ProxyError(f"{path}: cannot read the TITO file to append to ({exc.strerror})", 500) from None
        if old and not old.endswith("\n"):
            raise ProxyError(f"{path}: last line is incomplete; refusing to append to a torn file", 500)
        atomic_write_text(path, old + "".join(line + "\n" for line in lines))
        flushed = {c.run_id for c in calls} | {o.run_id for o in written}
        served = {r: {"calls": n, "output_tokens": t} for r, (n, t) in self.served.items() if take(r)}
        if wanted is not None:
            served = {r: served.get(r, {"calls": 0, "output_tokens": 0}) for r in wanted}
        self.calls = [c for c in self.calls if not take(c.run_id)]
        self.outcomes = [o for o in self.outcomes if not take(o.run_id)]
        self._ids -= {(c.run_id, c.call_id) for c in calls}
        for o in written:
            self.closed[o.run_id] = str(path)
            self._closed_outcome[o.run_id] = o
            self.served.pop(o.run_id, None)
        return {"path": str(path), "calls": len(calls), "outcomes": len(written), "runs": sorted(flushed),
                "served": served, "recovered": sorted(o.run_id for o in recovered)}

    def _check_flush(self, wanted: list[str] | None, outcomes: list[Outcome]) -> list[Outcome]:
        """The given outcomes that are not buffered yet; ProxyError (nothing changed) if any disagrees."""
        if wanted is None:
            raise ProxyError("outcomes: a flush that carries outcomes must name its run_ids")
        given = {}
        for o in outcomes:
            _check_score(o)
            if o.run_id not in wanted or o.run_id in given:
                raise ProxyError(f"outcomes: run {o.run_id!r} is not one of run_ids or is given twice")
            given[o.run_id] = o
        missing = [r for r in wanted if r not in given]
        if missing:
            raise ProxyError(f"outcomes: no outcome given for run {missing[0]!r} ({len(missing)} run(s))")
        closed = [r for r in wanted if r in self.closed]
        if closed:
            raise ProxyError(f"run_ids: run {closed[0]!r} was flushed already (its outcome is in "
                             f"{self.closed[closed[0]]})", 409)
        buffered = {o.run_id: o for o in self.outcomes}
        differ = [r for r in wanted if r in buffered and buffered[r] != given[r]]
        if differ:
            raise ProxyError(f"outcomes: run {differ[0]!r} has a different buffered outcome "
                             f"({buffered[differ[0]]} vs {given[differ[0]]})", 409)
        return [given[r] for r in wanted if r not in buffered]


def _check_score(outcome: Outcome) -> None:
    status = RunStatus(outcome.status)
    if status.has_score != (outcome.score is not None) or (
            outcome.score is not None and not 0.0 <= outcome.score <= 1.0):
        raise ProxyError(f"score: status {status.value} needs "
                         f"{'a score in [0, 1]' if status.has_score else 'score null'}, got {outcome.score!r}")
