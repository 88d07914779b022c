"""The proxy's event log: one JSON object per line, appended, one ``write`` per event.

Each event is ``{"t": <unix seconds>, "source": "proxy", "event": <kind>, ...}``. Kinds and their fields are
listed in docs/proxy.md (engine_added, engine_draining, engine_drained, engine_dead, engine_removed, move,
moved_call_done, call_lost). The runtime's own event log will merge these lines later.

Invariants
- Append-only: an existing log is never rewritten or truncated; each event is written with a single
  ``os.write`` on an ``O_APPEND`` descriptor, so lines from concurrent writers never interleave mid-line.
- Every event is also kept in memory (``events``, the latest ``keep``), so a caller can read what happened
  without a file.
"""
from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path
from typing import Any

from gyre_hpc.proxy.routing import ProxyError


class EventLog:
    def __init__(self, path: str | Path | None = None, keep: int = 10_000, clock=time.time):
        self.path = Path(path) if path is not None else None
        self.events: collections.deque[dict] = collections.deque(maxlen=keep)
        self._clock = clock
        self._fd = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> dict:
        record = {"t": self._clock(), "source": "proxy", "event": event, **fields}
        self.events.append(record)
        if self._fd is not None:
            os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        return record

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_events(path: str | Path) -> list[dict]:
    """All events of a log file, in order. A torn last line (a crash mid-write) is skipped; a bad line anywhere
    else is a ``ProxyError`` naming ``file:line``."""
    lines = Path(path).read_text().splitlines()
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i < len(lines):
                raise ProxyError(f"{path}:{i}: not a JSON event ({exc.msg})", 500) from None
    return out
