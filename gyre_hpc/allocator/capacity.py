"""The capacity model: how many unfinished runs the rollout cells can absorb, and how fast a loaded cell runs.

Two explicit, configurable pieces, shared by the policies (decisions) and the simulator (physics):

* ``CapacityModel.runs_per_cell`` — the unfinished runs one rollout cell absorbs without unacceptable
  slowdown. Gyre releases a cell only if ``unfinished_runs <= capacity(remaining rollout cells)``.
  ``capacity_from_curve`` derives it from the throughput curve (the load at which per-request decode
  speed has fallen to a chosen fraction of the unloaded speed, capped by KV-cache slots).
* ``speed_factor(load)`` — the progress rate of a run on a cell with ``load`` concurrent runs, relative to
  an unloaded engine: engine time (decode + prefill) stretches by ``1 + load / half_load`` (per-request decode
  speed halves at ``half_load``), tool time does not stretch. An engine decodes at most ``slots`` requests at
  once (``sim.engine_slots``, the live engine's ``max_running_requests``); with more runs on the cell they take
  turns, so each gets ``slots / load`` of the engine: the engine part stretches by a further ``load / slots``.
  With ``sim.load_model: calls`` only the runs inside a model call load the engine (a run waiting for a tool
  holds no request, as the live engine counts): ``engine_load`` solves for them.

Invariants
- ``capacity(n)`` is ``n * runs_per_cell``: monotone, zero for no cells.
- ``speed_factor`` is 1 at zero load, decreasing in load, and never below ``tool_frac``-bounded limits (> 0);
  above ``slots`` the cell's engine throughput (load x speed of the engine part) stays at its value at ``slots``.
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


def _stretch(n: float, half_load: float, slots: float) -> float:
    """How much longer an engine second takes with ``n`` requests on the engine (``slots`` decoded at once)."""
    return (1.0 + min(n, slots) / half_load) * max(1.0, n / slots)


def engine_load(load: float, half_load: float, tool_frac: float, slots: float = math.inf) -> float:
    """Runs inside a model call among ``load`` runs on a cell, when tool waits free the engine (``sim.load_model``
    calls): the fixed point n = load x (share of a run's time on the engine at n). A run's nominal second is
    tool_frac tool time and a = 1 - tool_frac engine time stretched by s(n), so n = load a s / (tool_frac + a s);
    with s = 1 + n / h (n <= slots) that is (a/h) n^2 + (1 - load a/h) n - load a = 0, above slots
    s = n (1 + slots/h) / slots, so n = load - tool_frac slots / (a (1 + slots/h))."""
    a = 1.0 - tool_frac
    if load <= 0 or a <= 0:
        return 0.0
    b = 1.0 - load * a / half_load
    n = 2.0 * load * a / (b + math.sqrt(b * b + 4.0 * (a / half_load) * load * a))  # the stable root
    if n > slots:
        n = load - tool_frac * slots / (a * (1.0 + slots / half_load))
    return n


def speed_factor(load: float, half_load: float, tool_frac: float, slots: float = math.inf,
                 calls_only: bool = False) -> float:
    """Progress rate of one run at ``load`` concurrent runs (1.0 = unloaded engine) on an engine that decodes at
    most ``slots`` requests at once (the others wait their turn). ``calls_only``: only the runs inside a model
    call load the engine (``engine_load``); else every run on the cell does (the paper's fitted model)."""
    if not calls_only and load <= slots:  # the common case (every run loads the engine, below its slots)
        return 1.0 / (tool_frac + (1.0 - tool_frac) * (1.0 + load / half_load))
    n = engine_load(load, half_load, tool_frac, slots) if calls_only else load
    return 1.0 / (tool_frac + (1.0 - tool_frac) * _stretch(n, half_load, slots))


def capacity_from_curve(half_load: float, speed_floor: float, kv_slots: int) -> int:
    """Largest load whose per-request engine speed is >= ``speed_floor`` x unloaded, capped by ``kv_slots``."""
    if not 0.0 < speed_floor <= 1.0:
        raise ValueError(f"speed_floor must be in (0, 1], got {speed_floor}")
    return int(min(kv_slots, math.floor(half_load * (1.0 / speed_floor - 1.0))))
