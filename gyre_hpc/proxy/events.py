"""The proxy's event log: the one event log (``gyre_hpc.allocator.eventlog``), records marked ``source: proxy``.

Each event is ``{"t": <unix seconds>, "source": "proxy", "event": <kind>, ...}``. Kinds and their fields are
listed in docs/proxy.md (engine_added, engine_draining, engine_drained, engine_dead, engine_removed, move,
moved_call_done, call_lost). The log's invariants (append-only, one write per line, the latest events also in
memory) are ``EventLog``'s.
"""
from __future__ import annotations

from pathlib import Path

from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.clock import Clock

__all__ = ["proxy_log"]


def proxy_log(path: str | Path | None = None, clock: Clock | None = None) -> EventLog:
    """The proxy's event log at ``path`` (None: in memory only)."""
    return EventLog(path, clock, source="proxy")
