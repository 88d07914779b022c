"""Fixed batches (non-streaming policies), as the simulator forms them (pure; no I/O, no threads).

Batch b is the groups admitted ``base + b*B .. base + b*B + B - 1`` (``base`` is 0, or the first group admitted
after a resume). A resume that re-issues the queries in flight at the preemption (``first``: their gids, admitted
again before any new one) puts them at the head of that order: the admission order is ``first`` then
``base, base + 1, ...``, and batches are cut from it B at a time. ``FixedBatches.ready(gid, item)`` holds a
ready group and returns the batches that became complete *and* whose predecessors all went out, each in
admission order — so a batch waits for its slowest query, and batches go out in order even when a later one
completes first.

Invariants (tests/unit/test_fixed_batches.py)
- Every held item is returned exactly once, inside the batch of its gid, batches in increasing order.
- Nothing of batch b is returned before every item of batches < b was.
"""
from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class FixedBatches(Generic[T]):
    def __init__(self, batch_groups: int, base: int = 0, first: tuple[int, ...] = ()):
        if batch_groups < 1:
            raise ValueError(f"batch_groups must be >= 1, got {batch_groups}")
        if any(g >= base for g in first) or len(set(first)) != len(first):
            raise ValueError(f"re-issued gids {list(first)} must be distinct and below base {base}")
        self.B, self.base = batch_groups, base  # base: the first gid admitted after the re-issued ones
        self.first = tuple(first)
        self.pos = 0  # position (in the admission order) of the next batch to go out
        self.held: dict[int, T] = {}

    def _gid(self, pos: int) -> int:
        return self.first[pos] if pos < len(self.first) else self.base + pos - len(self.first)

    def _position(self, gid: int) -> int | None:
        if gid in self.first:
            return self.first.index(gid)
        return None if gid < self.base else len(self.first) + gid - self.base

    def ready(self, gid: int, item: T) -> list[list[T]]:
        """Hold ``item`` (group ``gid`` is ready); the batches that can go out now, in order."""
        pos = self._position(gid)
        if pos is None or pos < self.pos or gid in self.held:
            raise ValueError(f"group {gid} is ready twice or belongs to a batch that already went out")
        self.held[gid] = item
        out = []
        while all(self._gid(p) in self.held for p in range(self.pos, self.pos + self.B)):
            out.append([self.held.pop(self._gid(p)) for p in range(self.pos, self.pos + self.B)])
            self.pos += self.B
        return out

    def holding(self) -> list[T]:
        """The held items by gid (a resume saves them with the trajectory buffer)."""
        return [item for _, item in sorted(list(self.held.items()))]  # list(): one atomic copy under the GIL
