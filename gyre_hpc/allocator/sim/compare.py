"""Run the configured policies on one workload and compare them (what ``gyre simulate`` prints).

Invariants
- Every policy sees the same workload (same seed, same queries in the same order).
- Every configured policy is validated before any simulation starts, so bad input fails fast.
- ``speedups[f"{a}_vs_{b}"] = hours[b] / hours[a]`` (> 1 means ``a`` is faster).
"""
from __future__ import annotations

from typing import Any

from gyre_hpc.allocator.policies import make_policy, validate
from gyre_hpc.clock import WallClock
from gyre_hpc.config import GyreConfig
from gyre_hpc.allocator.sim import workload as workload_mod
from gyre_hpc.allocator.sim.metrics import summarize
from gyre_hpc.allocator.sim.simulator import Simulation

#: summary keys that describe the workload rather than the policy
WORKLOAD_KEYS = ("frac_queries_ge_4h", "frac_queries_hit_timeout", "frac_queries_within_5pct_of_timeout",
                 "query_hours_mean", "tokens_per_run_mean", "trained_tokens_per_run_mean")


def validate_all(cfg: GyreConfig) -> None:
    for name in cfg.sim.policies:
        validate(name, cfg.scheduler, cfg.cluster.cells)


def queries_needed(cfg: GyreConfig) -> int:
    b = cfg.scheduler.batch_groups
    return int((cfg.sim.steps + cfg.scheduler.max_window_batches + 2) * b)


def simulate_policy(cfg: GyreConfig, name: str, wl: workload_mod.SimWorkload) -> tuple[Simulation, dict[str, float]]:
    policy = make_policy(name, cfg.scheduler, cfg.cluster.cells)
    sim = Simulation(policy, cfg.sim, cfg.scheduler, wl, cfg.cluster.cells, cfg.workload.timeout_h * 3600.0)
    compute = WallClock()  # the simulator's own compute time (its clock is virtual)
    end = sim.run()
    return sim, summarize(sim, end, compute.now())


def compare(cfg: GyreConfig) -> tuple[dict[str, Any], dict[str, Simulation]]:
    """(JSON-ready result, the Simulation objects for plots) for every policy in ``cfg.sim.policies``."""
    validate_all(cfg)
    wl = workload_mod.load(cfg.workload, cfg.sim, queries_needed(cfg), cfg.run.seed,
                           j_max=cfg.trajectory.j_max)
    sims, results = {}, {}
    for name in cfg.sim.policies:
        sims[name], results[name] = simulate_policy(cfg, name, wl)
    names = list(results)
    speedups = {f"{a}_vs_{b}": results[b]["hours"] / results[a]["hours"]
                for a in names for b in names if a != b}
    source = "gyre" if "gyre" in results else names[0]
    workload = {k: results[source][k] for k in WORKLOAD_KEYS}
    workload["source_policy"] = source
    workload["timeout_h"] = cfg.workload.timeout_h
    return {"policies": results, "speedups": speedups, "workload": workload,
            "steps": cfg.sim.steps, "cells": cfg.cluster.cells}, sims
