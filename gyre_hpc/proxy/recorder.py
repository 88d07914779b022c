"""TITO recording: the proxy buffers one ``Call`` per finished harness call and flushes them to a JSONL file.

Outcomes are decided by the harness (grader, timeouts); it either writes them itself or posts them to the
proxy (``POST /tito/outcome``), in which case they are flushed with the calls into the same file, so one
step's file is complete for ``read_tito``.

Invariants
- Call ids are unique within a run: a ``(run_id, call_id)`` in flight or buffered is refused (``ProxyError``
  409); a call that failed releases its id, a flushed call releases it too (the file it went to has it).
- ``flush`` moves the selected runs' records (all runs by default) from the buffer to the file, calls in the
  order they finished, then outcomes; records of other runs stay buffered. The file is appended to atomically:
  old content + new lines go to a temporary sibling that replaces it (``gyre_hpc.io``), so a reader never sees
  a torn line and a failed flush leaves the buffer unchanged.
- A flush writes only to ``<tito_dir>/<name>``: ``name`` is a plain file name (``FILE_NAME``, no directory part)
  and neither the file nor its directory may be a symbolic link; the request never gives a path.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from gyre_hpc.io import atomic_write_text
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

    def reserve(self, run_id: str, call_id: str) -> None:
        if (run_id, call_id) in self._ids:
            raise ProxyError(f"rid: call {call_id!r} of run {run_id!r} was already sent (call ids are unique "
                             f"within a run)", 409)
        self._ids.add((run_id, call_id))

    def unreserve(self, run_id: str, call_id: str) -> None:
        self._ids.discard((run_id, call_id))

    def add_call(self, call: Call) -> None:
        self.calls.append(call)

    def add_outcome(self, outcome: Outcome) -> None:
        status = RunStatus(outcome.status)
        if status.has_score != (outcome.score is not None) or (
                outcome.score is not None and not 0.0 <= outcome.score <= 1.0):
            raise ProxyError(f"score: status {status.value} needs "
                             f"{'a score in [0, 1]' if status.has_score else 'score null'}, got {outcome.score!r}")
        if any(o.run_id == outcome.run_id for o in self.outcomes):
            raise ProxyError(f"run_id: run {outcome.run_id!r} already has a buffered outcome", 409)
        self.outcomes.append(outcome)

    def pending(self) -> dict[str, int]:
        return {"calls": len(self.calls), "outcomes": len(self.outcomes)}

    def flush(self, path: str | Path, run_ids: Iterable[str] | None = None) -> dict:
        """Append the selected runs' buffered records to ``path``; returns what was written."""
        wanted = None if run_ids is None else set(run_ids)
        take = (lambda r: True) if wanted is None else (lambda r: r in wanted)
        calls = [c for c in self.calls if take(c.run_id)]
        outcomes = [o for o in self.outcomes if take(o.run_id)]
        lines = [json.dumps(call_record(c), separators=(",", ":")) for c in calls]
        lines += [json.dumps(outcome_record(o), separators=(",", ":")) for o in outcomes]
        path = Path(path)
        try:
            old = path.read_text() if path.exists() else ""
        except OSError as exc:
            raise ProxyError(f"{path}: cannot read the TITO file to append to ({exc.strerror})", 500) from None
        if old and not old.endswith("\n"):
            raise ProxyError(f"{path}: last line is incomplete; refusing to append to a torn file", 500)
        atomic_write_text(path, old + "".join(line + "\n" for line in lines))
        flushed = {c.run_id for c in calls} | {o.run_id for o in outcomes}
        self.calls = [c for c in self.calls if not take(c.run_id)]
        self.outcomes = [o for o in self.outcomes if not take(o.run_id)]
        self._ids -= {(c.run_id, c.call_id) for c in calls}
        return {"path": str(path), "calls": len(calls), "outcomes": len(outcomes), "runs": sorted(flushed)}
