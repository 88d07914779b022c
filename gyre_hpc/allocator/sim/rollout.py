"""The rollout side of the simulator: runs on cells, each cell a processor-sharing engine in virtual time.

Every run on cell c progresses at the same rate ``speed_factor(load_c)`` (nominal work seconds per second),
so each cell keeps a virtual clock ``V_c`` (nominal work done by any one of its runs) and a heap of virtual
finish times; a load change costs O(log n) instead of touching every run. A run that leaves a cell
(finished, timed out, moved) turns the virtual work it did into per-version segments, using the cell's
record of ``V_c`` at each policy-version bump.

Invariants
- ``load[c]`` equals the number of runs whose ``where`` is c; only ROLLOUT cells receive runs.
- A cell never holds more than ``kv_slots`` runs; runs without room are parked FIFO and placed when room
  appears (a finishing run, a cell returning to rollout).
- Work is conserved: a run's segments sum to the nominal work it has done, never more than its work.
- Callers advance a cell to ``now`` before changing its load, and ``flush`` rates and finish events after.
"""
from __future__ import annotations

import heapq
import math
from collections import deque

from gyre_hpc.allocator.capacity import speed_factor

NOT_STARTED, PARKED, DONE, LIMBO = -3, -1, -2, -4


class RolloutPool:
    def __init__(self, n_cells: int, work: list[float], slots: int, half_load: float, tool_frac: float,
                 capacity: int, engine_slots: float = math.inf, calls_only: bool = False):
        self.n = n_cells
        self.slots, self.half_load, self.tool_frac, self.cap = slots, half_load, tool_frac, capacity
        self.engine_slots, self.calls_only = engine_slots, calls_only
        self.V = [0.0] * n_cells
        self.t = [0.0] * n_cells
        self.rate = [1.0] * n_cells
        self.load = [0] * n_cells
        self.heap: list[list[tuple[float, int]]] = [[] for _ in range(n_cells)]
        self.stamp = [0] * n_cells
        self.bumps: list[list[tuple[float, int]]] = [[] for _ in range(n_cells)]
        self.util = [0.0] * n_cells          # integral of min(1, load / capacity) while rolling out
        self.active = [False] * n_cells      # cell is in ROLLOUT
        self.left = list(work)
        n = len(work)
        self.where = [NOT_STARTED] * n
        self.varr = [0.0] * n
        self.vfin = [0.0] * n
        self.ver_arr = [0] * n
        self.bidx = [0] * n
        self.segs: list[dict[int, float]] = [dict() for _ in range(n)]
        self.parked: deque[int] = deque()
        self.parked_count = 0
        self.touched: set[int] = set()

    # ------------------------------------------------------------------ clocks
    def advance(self, c: int, now: float) -> None:
        dt = now - self.t[c]
        if dt > 0:
            self.V[c] += dt * self.rate[c]
            if self.active[c]:
                self.util[c] += dt * min(1.0, self.load[c] / self.cap)
            self.t[c] = now

    def next_finish(self, c: int) -> tuple[float, int] | None:
        """(time, run) of the next run to finish on ``c`` at the current rate, or None."""
        h, where, vfin = self.heap[c], self.where, self.vfin
        while h and (where[h[0][1]] != c or vfin[h[0][1]] != h[0][0]):
            heapq.heappop(h)
        if not h:
            return None
        return self.t[c] + max(0.0, h[0][0] - self.V[c]) / self.rate[c], h[0][1]

    def flush_rates(self) -> list[int]:
        """Recompute the rate of every touched cell; returns them (their finish events must be renewed)."""
        cells = sorted(self.touched)
        for c in cells:
            self.rate[c] = speed_factor(self.load[c], self.half_load, self.tool_frac, self.engine_slots,
                                        self.calls_only)
            self.stamp[c] += 1
        self.touched.clear()
        return cells

    def bump(self, now: float, version: int) -> None:
        """A new policy version: runs generate with it from now on."""
        for c in range(self.n):
            if self.load[c]:
                self.advance(c, now)
                self.bumps[c].append((self.V[c], version))

    # ------------------------------------------------------------------ placement
    def best_cell(self) -> int:
        best, best_load = -1, self.slots
        for c in range(self.n):
            if self.active[c] and self.load[c] < best_load:
                best, best_load = c, self.load[c]
        return best

    def place(self, i: int, now: float, version: int) -> bool:
        """Put run ``i`` on the least-loaded rollout cell with room; False (nothing changed) if none."""
        c = self.best_cell()
        if c < 0:
            return False
        self.advance(c, now)
        self.where[i] = c
        self.varr[i] = v = self.V[c]
        self.vfin[i] = vf = v + self.left[i]
        self.ver_arr[i] = version
        self.bidx[i] = len(self.bumps[c])
        heapq.heappush(self.heap[c], (vf, i))
        self.load[c] += 1
        self.touched.add(c)
        return True

    def park(self, i: int) -> None:
        """Queue run ``i`` (FIFO) until a rollout cell has room."""
        self.where[i] = PARKED
        self.parked.append(i)
        self.parked_count += 1

    def unpark_done(self, i: int) -> None:
        """A parked run ended (timeout); its queue entry is skipped later."""
        self.where[i] = DONE
        self.parked_count -= 1

    def fill(self, now: float, version: int) -> list[int]:
        """Place parked runs while some rollout cell has room; returns the runs placed."""
        placed = []
        while self.parked:
            i = self.parked[0]
            if self.where[i] != PARKED:
                self.parked.popleft()
                continue
            if not self.place(i, now, version):
                break
            self.parked.popleft()
            self.parked_count -= 1
            placed.append(i)
        return placed

    def leave(self, i: int, now: float) -> int:
        """Take run ``i`` off its cell, crediting its work per version; returns the cell."""
        c = self.where[i]
        self.advance(c, now)
        done = min(self.V[c] - self.varr[i], self.left[i])
        if self.vfin[i] <= self.V[c]:
            done = self.left[i]
        seg, ver, prev = self.segs[i], self.ver_arr[i], self.varr[i]
        end = self.varr[i] + done
        for vb, new_ver in self.bumps[c][self.bidx[i]:]:
            if vb >= end:
                break
            seg[ver] = seg.get(ver, 0.0) + (vb - prev)
            prev, ver = vb, new_ver
        seg[ver] = seg.get(ver, 0.0) + (end - prev)
        self.left[i] -= done
        self.load[c] -= 1
        self.where[i] = LIMBO  # the caller decides what happens next
        self.touched.add(c)
        return c

    def rebalance(self, now: float, version: int) -> list[int]:
        """Even out the load of the rollout cells (no cell more than one run above another) by moving runs from the
        most to the least loaded; the live proxy routes every call to the least-loaded engine, so a cell that
        returns to rollout gets its share at once (``sim.load_model: calls``). Returns the runs moved."""
        moved = []
        while True:
            cells = [c for c in range(self.n) if self.active[c]]
            if len(cells) < 2:
                return moved
            hi = max(cells, key=lambda c: self.load[c])
            lo = min(cells, key=lambda c: self.load[c])
            if self.load[hi] - self.load[lo] <= 1:
                return moved
            i = max(i for _, i in self.heap[hi] if self.where[i] == hi)
            self.leave(i, now)
            self.advance(lo, now)
            self.where[i] = lo
            self.varr[i] = v = self.V[lo]
            self.vfin[i] = v + self.left[i]
            self.ver_arr[i] = version
            self.bidx[i] = len(self.bumps[lo])
            heapq.heappush(self.heap[lo], (self.vfin[i], i))
            self.load[lo] += 1
            self.touched.add(lo)
            moved.append(i)

    def evict(self, c: int, now: float, overhead_s: float) -> list[int]:
        """Take every run off cell ``c`` (it leaves rollout); each gets ``overhead_s`` more work."""
        runs = sorted({i for _, i in self.heap[c] if self.where[i] == c})
        for i in runs:
            self.leave(i, now)
            self.left[i] += overhead_s
        self.heap[c] = []
        return runs

    def done_work(self, i: int) -> float:
        return sum(self.segs[i].values())

    @staticmethod
    def finite(x: float) -> bool:
        return math.isfinite(x)
