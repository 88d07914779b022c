"""The event core: one heap of ``(time, sequence, kind, a, b)`` in virtual time.

Invariants
- Events pop in time order; events at the same time pop in the order they were pushed (the sequence
  number breaks ties), so a simulation is deterministic for a given seed.
- Time never goes backwards: pushing an event before the last popped time is a ``SchedulingError``.
"""
from __future__ import annotations

import heapq

from gyre_hpc.errors import SchedulingError


class EventQueue:
    __slots__ = ("_heap", "_seq", "now", "popped")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.now = 0.0
        self.popped = 0

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        if t < self.now:
            raise SchedulingError(f"event of kind {kind} at t={t} is before now={self.now}")
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))
        self._seq += 1

    def pop(self) -> tuple[float, int, int, int, int]:
        ev = heapq.heappop(self._heap)
        self.now = ev[0]
        self.popped += 1
        return ev

    def __len__(self) -> int:
        return len(self._heap)
