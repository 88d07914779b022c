"""``gyre tune``: the simulator chooses the scheduling knobs for a workload, the same way for every policy.

Search space (``SPACE``): ``scheduler.theta``, ``scheduler.tau_s``, ``scheduler.mu``, gyre's
``scheduler.satellite_min_work_s`` (the training backlog per cell at which a satellite joins; without it a
workload whose training is a large share of a step never gets a satellite: benchmarks/results/sim_gyre_advantage.md)
and the cell split ``scheduler.async_train_cells`` (the fixed training pool of the async policies). Each policy reads only some of
them (``READS``); the objective is the geometric mean of the simulated hours of every policy in
``sim.policies``, so a knob read by one policy is tuned for that policy, and one read by several (theta,
tau_s, mu: gyre and colocate_streaming) for all of them alike. No policy gets a knob tuned for another.

Procedure: coordinate descent from the config's own values: for each knob in turn, simulate every value of
its grid (the others fixed at the best point so far) and keep the best; repeat the passes until a pass
improves nothing or ``budget`` simulations have run. A candidate is feasible only if every policy's E[d] stays
at or below ``1.1 x scheduler.staleness_target`` (the fairness rule of staleness.py); the config's own point
is always evaluated first, so the result is never worse than the defaults on the simulated workload.

``tau_s`` and ``satellite_min_work_s`` are searched on grids scaled by the workload's time scale: multiples of
the config's value (or, when it is 0, of one hundredth of the median query duration).

Invariants
- Deterministic: the same config and budget give the same overlay.
- At most ``budget`` simulations are run (the cache counts each distinct point once).
- The overlay names only keys of ``SPACE``; loading it through ``--overlay`` reproduces the chosen point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from gyre_hpc.allocator.sim.compare import queries_needed, simulate_policy, validate_all
from gyre_hpc.allocator.sim.workload import SimWorkload
from gyre_hpc.config import GyreConfig, apply_overrides, build, to_dict
from gyre_hpc.errors import ConfigError, SchedulingError

SPACE = ("theta", "tau_s", "mu", "satellite_min_work_s", "async_train_cells")
READS = {"gyre": ("theta", "tau_s", "mu", "satellite_min_work_s"), "colocate_streaming": ("theta", "tau_s", "mu"),
         "async": ("async_train_cells",), "async_streaming": ("async_train_cells",), "colocate": ()}
STALENESS_SLACK = 1.1


@dataclass
class Tuning:
    """The search's record: every evaluated point, and the best feasible one."""

    start: dict[str, Any]
    best: dict[str, Any]
    best_hours: dict[str, float]
    best_score: float
    start_score: float
    evaluated: list[dict[str, Any]] = field(default_factory=list)

    def overlay(self) -> dict[str, Any]:
        return {"scheduler": {k: self.best[k] for k in SPACE}}


def grid(key: str, cfg: GyreConfig, query_s: float) -> list[Any]:
    """The values tried for ``key`` (always including the config's own)."""
    s = cfg.scheduler
    if key == "theta":
        values = [0.25, 0.5, 0.75, 1.0]
    elif key == "tau_s":
        unit = s.tau_s if s.tau_s > 0 else max(query_s / 100.0, 1e-3)
        values = [0.0] + [round(unit * f, 6) for f in (0.25, 0.5, 1.0, 2.0, 4.0)]
    elif key == "mu":
        values = [1, 2, 3]
    elif key == "satellite_min_work_s":
        unit = s.satellite_min_work_s if s.satellite_min_work_s > 0 else max(query_s / 100.0, 1e-3)
        values = [0.0] + [round(unit * f, 6) for f in (0.1, 0.25, 0.5, 2.0)]
    else:
        values = list(range(1, cfg.cluster.cells))
    own = getattr(s, key)
    return sorted(set(values) | {own})


def _relevant(cfg: GyreConfig) -> list[str]:
    keys = {k for name in cfg.sim.policies for k in READS[name]}
    return [k for k in SPACE if k in keys]


def _with(cfg: GyreConfig, point: dict[str, Any]) -> Any:
    data = apply_overrides(to_dict(cfg), [f"scheduler.{k}={v}" for k, v in point.items()], type(cfg))
    return build(type(cfg), data)


def evaluate(cfg: GyreConfig, wl: SimWorkload) -> tuple[float, dict[str, float], bool]:
    """(objective, hours per policy, feasible) of ``cfg`` on ``wl``; a stalled simulation is infeasible."""
    hours, feasible = {}, True
    bound = STALENESS_SLACK * cfg.scheduler.staleness_target
    for name in cfg.sim.policies:
        try:
            _, r = simulate_policy(cfg, name, wl)
        except SchedulingError:
            return math.inf, {}, False
        hours[name] = r["hours"]
        feasible &= r["staleness_mean"] <= bound
    score = math.exp(sum(math.log(h) for h in hours.values()) / len(hours))
    return score, hours, feasible


def tune(cfg: GyreConfig, wl: SimWorkload, budget: int = 24, query_s: float = 3600.0,
         progress: Callable[[str], None] | None = None) -> Tuning:
    """Coordinate descent over ``SPACE`` (module docstring); ``wl`` must hold ``queries_needed(cfg)`` queries."""
    if budget < 1:
        raise ConfigError(f"--budget: must be >= 1, got {budget}")
    validate_all(cfg)
    start = {k: getattr(cfg.scheduler, k) for k in SPACE}
    cache: dict[tuple, tuple[float, dict, bool]] = {}
    record: list[dict[str, Any]] = []

    def score(point: dict[str, Any]) -> float:
        key = tuple(point[k] for k in SPACE)
        if key not in cache:
            if len(cache) >= budget:
                return math.inf
            trial = _with(cfg, point)
            try:
                validate_all(trial)
                cache[key] = evaluate(trial, wl)
            except ConfigError:
                cache[key] = (math.inf, {}, False)
            s, hours, ok = cache[key]
            record.append({**point, "score_hours": s, "hours": hours, "feasible": ok})
            if progress:
                progress(f"{len(cache):>3}/{budget} {point} -> {s:.3f} h{'' if ok else ' (infeasible)'}")
        s, _, ok = cache[key]
        return s if ok else math.inf

    best = dict(start)
    best_s = start_s = score(best)
    improved = True
    while improved and len(cache) < budget:
        improved = False
        for k in _relevant(cfg):
            for v in grid(k, cfg, query_s):
                trial = {**best, k: v}
                s = score(trial)
                if s < best_s - 1e-9:
                    best, best_s, improved = trial, s, True
    best_hours = cache[tuple(best[k] for k in SPACE)][1]
    return Tuning(start, best, best_hours, best_s, start_s, record)


def workload_for(cfg: GyreConfig) -> SimWorkload:
    """The workload ``gyre simulate`` would use for ``cfg``."""
    from gyre_hpc.allocator.sim import workload as workload_mod

    return workload_mod.load(cfg.workload, cfg.sim, queries_needed(cfg), cfg.run.seed, j_max=cfg.trajectory.j_max)
