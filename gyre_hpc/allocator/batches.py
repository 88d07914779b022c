"""Batch formation and the burst gate, written once: the simulator and the live runtime both call these (pure).

**Fixed batches** (non-streaming policies).

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

**The burst gate** (``burst_open``): a policy with ``mu`` steps per burst lets the training side start work on
a new step only while the burst has fewer than ``mu`` steps (``mu`` None: no bursts, always open).
**A batch may start** (``batch_may_start``): a streaming policy trains whatever is ready; a fixed-batch policy
starts a step's batch only once a whole batch (B groups) is ready; a step already started goes on.

Invariants (tests/unit/test_fixed_batches.py, tests/unit/test_batch_rules.py)
- ``burst_open`` is False exactly when ``mu`` is set and ``burst_steps >= mu``.
- ``batch_may_start`` is True for a streaming policy or a started step; otherwise exactly when ``ready >= B``.
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


def burst_open(mu: int | None, burst_steps: int) -> bool:
    """May the training side start on another step in this burst (``burst_steps`` done, ``mu`` per burst)?"""
    return mu is None or burst_steps < mu


def batch_may_start(streaming: bool, started: bool, ready: int, batch_groups: int) -> bool:
    """May the training side take a ready group: streaming, a step already under way, or a whole batch ready."""
    return streaming or started or ready >= batch_groups
