"""Fixed batches (non-streaming policies), as the simulator forms them (pure; no I/O, no threads).

Batch b is the groups admitted ``base + b*B .. base + b*B + B - 1`` (``base`` is 0, or the first group admitted
after a resume). ``FixedBatches.ready(gid, item)`` holds a ready group and returns the batches that became
complete *and* whose predecessors all went out, each in admission order — so a batch waits for its slowest
query, and batches go out in order even when a later one completes first.

Invariants (tests/unit/test_fixed_batches.py)
- Every held item is returned exactly once, inside the batch of its gid, batches in increasing order.
- Nothing of batch b is returned before every item of batches < b was.
"""
from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class FixedBatches(Generic[T]):
    def __init__(self, batch_groups: int, base: int = 0):
        if batch_groups < 1:
            raise ValueError(f"batch_groups must be >= 1, got {batch_groups}")
        self.B, self.base = batch_groups, base  # base: the first gid of the next batch to go out
        self.held: dict[int, T] = {}

    def ready(self, gid: int, item: T) -> list[list[T]]:
        """Hold ``item`` (group ``gid`` is ready); the batches that can go out now, in order."""
        if gid < self.base or gid in self.held:
            raise ValueError(f"group {gid} is ready twice or belongs to a batch that already went out")
        self.held[gid] = item
        out = []
        while all(g in self.held for g in range(self.base, self.base + self.B)):
            out.append([self.held.pop(g) for g in range(self.base, self.base + self.B)])
            self.base += self.B
        return out

    def holding(self) -> list[T]:
        """The held items by gid (a resume saves them with the trajectory buffer)."""
        return [item for _, item in sorted(list(self.held.items()))]  # list(): one atomic copy under the GIL
