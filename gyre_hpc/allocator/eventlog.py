"""The allocator's event log: one JSON object per line, appended and flushed line by line.

Every record has ``t`` (seconds on the allocator's clock, the time line the policy saw), ``wall`` (Unix time)
and ``event`` (``start``, ``hello``, ``order``, ``switch_done``, ``runs``, ``groups_ready``,
``train_progress``, ``step``, ``lost``, ``rejected``, ``shutdown``, ``bye``, ``stop``; docs/allocator.md lists
the fields of each).

Invariants (tests/unit/test_allocator_server.py)
- A record is on disk (flushed) when ``write`` returns: a reader, or a post-mortem after a crash, sees every
  record written so far; at most the last line of a killed process is torn.
- ``read_events`` returns the complete records in order; it skips only a torn final line (no newline) and
  raises ``ProtocolError`` naming ``file:line`` for any other line that is not a JSON object with an ``event``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gyre_hpc.clock import Clock
from gyre_hpc.errors import ProtocolError


class EventLog:
    def __init__(self, path: str | Path, clock: Clock):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"t": round(self.clock.now(), 6), "wall": round(time.time(), 6), **record})
        self._f.write(line + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_events(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is either empty or a torn line
    out = []
    for n, line in enumerate(complete, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or "event" not in rec:
            raise ProtocolError(f"{path}:{n}: an event record is a JSON object with an 'event', got {line[:80]!r}")
        out.append(rec)
    return out
