"""The one event log (writer and reader) of a live run: the allocator's ``events.jsonl`` and the proxy's
``proxy-events.jsonl`` are both written by ``EventLog`` and read back by ``read_events``.

Every record is one JSON object on one line, with ``t``, ``event`` and the event's fields. With an injected
``Clock`` (the allocator's), ``t`` is seconds on that clock (the time line the policy saw) and ``wall`` is Unix
time; without one (the proxy), ``t`` is Unix time. A ``source`` (the proxy's ``"proxy"``) follows ``t``.
Allocator events: ``start``, ``hello``, ``order``, ``switch_done``, ``runs``, ``groups_ready``,
``train_progress``, ``step``, ``lost``, ``rejected``, ``shutdown``, ``bye``, ``stop`` (docs/allocator.md lists the
fields of each); the proxy's kinds are in docs/proxy.md.

Invariants (tests/unit/test_allocator_server.py, tests/unit/test_proxy_recording.py)
- Append-only, one ``os.write`` per record on an ``O_APPEND`` descriptor: a record is on disk when ``write``
  returns (a reader, or a post-mortem after a crash, sees every record written so far), an existing log is never
  rewritten, and lines of concurrent writers never interleave; at most the last line of a killed process is torn.
- The latest ``keep`` records are also in memory (``events``, ``of(kind)``), with or without a file.
- ``read_events`` reads through the one JSONL reader (``gyre_hpc.files.jsonl``) and returns the complete records in
  order; it skips only a torn final line (no newline) and raises ``ProtocolError`` naming ``file:line`` for any
  other line that is not a JSON object with an ``event``.
"""
from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.errors import ProtocolError
from gyre_hpc.files.jsonl import scan


class EventLog:
    def __init__(self, path: str | Path | None = None, clock: Clock | None = None, *, source: str | None = None,
                 keep: int = 10_000):
        self.path = Path(path) if path is not None else None
        self.clock, self.source = clock, source
        self._stamps = clock or WallClock()  # wall(): the epoch stamp (``t`` itself when no clock was given)
        self.events: collections.deque[dict] = collections.deque(maxlen=keep)
        self._fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any] | str, **fields: Any) -> dict[str, Any]:
        """Append ``record`` (a dict with an ``event``, or the event's name with its ``fields``); returns it
        as written."""
        body = {"event": record, **fields} if isinstance(record, str) else {**record, **fields}
        if self.clock is not None:
            head: dict[str, Any] = {"t": round(self.clock.now(), 6), "wall": round(self._stamps.wall(), 6)}
        else:
            head = {"t": self._stamps.wall()}
        rec = {**head, **({"source": self.source} if self.source is not None else {}), **body}
        self.events.append(rec)
        if self._fd is not None:
            os.write(self._fd, (json.dumps(rec) + "\n").encode())
        return rec

    def of(self, kind: str) -> list[dict]:
        """The kept records of event ``kind``."""
        return [e for e in self.events if e["event"] == kind]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of the event log ``path``, in order (see the module's invariants)."""
    out = []
    for line in scan(path, ProtocolError, torn_tail=True, what="event log"):
        if line.problem:
            raise ProtocolError(f"{path}:{line.number}: {line.problem}")
        if not isinstance(line.value, dict) or "event" not in line.value:
            raise ProtocolError(f"{path}:{line.number}: an event record is a JSON object with an 'event', got "
                                f"{json.dumps(line.value)[:80]}")
        out.append(line.value)
    return out
