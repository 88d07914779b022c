"""The capacity model: how many unfinished runs the rollout cells can absorb, and how fast a loaded cell runs.

Two explicit, configurable pieces, shared by the policies (decisions) and the simulator (physics):

* ``CapacityModel.runs_per_cell`` — the unfinished runs one rollout cell absorbs without unacceptable
  slowdown. Gyre releases a cell only if ``unfinished_runs <= capacity(remaining rollout cells)``.
  ``capacity_from_curve`` derives it from the throughput curve (the load at which per-request decode
  speed has fallen to a chosen fraction of the unloaded speed, capped by KV-cache slots).
* ``speed_factor(load)`` — the progress rate of a run on a cell with ``load`` concurrent runs, relative to
  an unloaded engine: engine time (decode + prefill) stretches by ``1 + load / half_load`` (per-request decode
  speed halves at ``half_load``), tool time does not stretch.

Invariants
- ``capacity(n)`` is ``n * runs_per_cell``: monotone, zero for no cells.
- ``speed_factor`` is 1 at zero load, decreasing in load, and never below ``tool_frac``-bounded limits (> 0).
- ``can_release(state, cell)`` is true only if the other rollout cells' capacity covers every unfinished run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gyre_hpc.allocator.state import SchedState
from gyre_hpc.allocator.types import Role


@dataclass(frozen=True)
class CapacityModel:
    runs_per_cell: int

    def capacity(self, n_cells: int) -> int:
        return max(0, n_cells) * self.runs_per_cell

    def can_release(self, state: SchedState, cell: int) -> bool:
        """True if the rollout cells other than ``cell`` can absorb all unfinished runs."""
        others = sum(1 for i, c in enumerate(state.cells) if c.role is Role.ROLLOUT and i != cell)
        return state.unfinished_runs <= self.capacity(others)


def speed_factor(load: float, half_load: float, tool_frac: float) -> float:
    """Progress rate of one run at ``load`` concurrent runs (1.0 = unloaded engine)."""
    return 1.0 / (tool_frac + (1.0 - tool_frac) * (1.0 + load / half_load))


def capacity_from_curve(half_load: float, speed_floor: float, kv_slots: int) -> int:
    """Largest load whose per-request engine speed is >= ``speed_floor`` x unloaded, capped by ``kv_slots``."""
    if not 0.0 < speed_floor <= 1.0:
        raise ValueError(f"speed_floor must be in (0, 1], got {speed_floor}")
    return int(min(kv_slots, math.floor(half_load * (1.0 / speed_floor - 1.0))))
