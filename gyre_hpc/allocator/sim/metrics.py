"""Summaries of one simulation: wall time, idle fractions, staleness, and the query-duration distribution.

Definitions
- ``hours``: time of the last configured optimizer step.
- ``train_idle_frac``: of the cell-time spent in the TRAIN role, the part not computing (waiting for ready
  groups, pulling weights, or waiting for the core's optimizer step).
- ``rollout_idle_frac``: of the cell-time spent in the ROLLOUT role, ``1 - mean(min(1, load / capacity))``
  with the scheduler's capacity model (an engine with fewer runs than it can absorb is partly idle).
- ``switch_frac``: cell-time in transitions (DRAINING, LOADING) over all cell-time.
- Query duration: from admission to the end of its longest run; ``frac_queries_hit_timeout`` counts queries
  whose longest run was cut by the timeout; only queries that completed before the end are counted.

Invariants
- Fractions are in [0, 1]; role times of all cells sum to cells x hours.
- ``switches`` counts each ordered switch once (its two timeline entries, transition and target, are one).
"""
from __future__ import annotations

import numpy as np

from gyre_hpc.allocator.sim.rollout import DONE
from gyre_hpc.allocator.sim.simulator import Simulation


def role_times(sim: Simulation, end: float) -> dict[str, float]:
    """Cell-seconds spent in each role until ``end``."""
    out: dict[str, float] = {}
    for events in sim.timeline:
        for (t0, role), (t1, _) in zip(events, events[1:] + [(end, "")]):
            out[role] = out.get(role, 0.0) + max(0.0, min(t1, end) - t0)
    return out


def switch_count(sim: Simulation) -> int:
    """Role switches ordered: each enters one transition (DRAINING or LOADING) and then its target role."""
    return sum(1 for events in sim.timeline for _, role in events if role in ("draining", "loading"))


def query_durations(sim: Simulation) -> tuple[np.ndarray, np.ndarray]:
    """(durations in seconds, hit-timeout flags) of every completed query."""
    start, end = np.asarray(sim.q_start), np.asarray(sim.q_end)
    done = ~np.isnan(end)
    return end[done] - start[done], np.asarray(sim.q_timeout)[done]


def summarize(sim: Simulation, end: float, wall_s: float) -> dict[str, float]:
    """The per-policy numbers ``gyre simulate`` prints."""
    pool = sim.pool
    for c in range(pool.n):
        pool.advance(c, end)
    roles = role_times(sim, end)
    total = end * pool.n
    train_t, roll_t = roles.get("train", 0.0), roles.get("rollout", 0.0)
    switch_t = roles.get("draining", 0.0) + roles.get("loading", 0.0)
    durations, hit = query_durations(sim)
    timeout = sim.timeout
    steps = np.diff(np.concatenate([[0.0], sim.step_times]))
    ended = [r for r in range(len(pool.segs)) if pool.segs[r] and pool.where[r] == DONE]
    rollout_tok = [sum(pool.segs[r].values()) * sim.tok_rate[r] for r in ended]
    trained = [sum(sim.trained(r)[1]) for r in ended]
    out = {
        "hours": end / 3600.0,
        "step_hours_mean": float(steps.mean() / 3600.0),
        "train_idle_frac": float(1.0 - min(1.0, sim.train_busy / train_t)) if train_t else 0.0,
        "rollout_idle_frac": float(1.0 - sum(pool.util) / roll_t) if roll_t else 0.0,
        "train_cell_frac": train_t / total,
        "rollout_cell_frac": roll_t / total,
        "switch_frac": switch_t / total,
        "switches": switch_count(sim),
        "queries_completed": int(durations.size),
        "query_hours_mean": float(durations.mean() / 3600.0) if durations.size else 0.0,
        **{f"query_hours_p{q}": float(np.percentile(durations, q) / 3600.0) if durations.size else 0.0
           for q in (10, 50, 90)},
        "frac_queries_ge_4h": float((durations >= 4 * 3600.0).mean()) if durations.size else 0.0,
        "frac_queries_hit_timeout": float(hit.mean()) if durations.size else 0.0,
        "frac_queries_within_5pct_of_timeout": float((durations >= 0.95 * timeout).mean()) if durations.size else 0.0,
        "tokens_per_run_mean": float(np.mean(rollout_tok)) if rollout_tok else 0.0,
        "trained_tokens_per_run_mean": float(np.mean(trained)) if trained else 0.0,
        "events": sim.q.popped,
        "sim_seconds": wall_s,
        "events_per_s": sim.q.popped / wall_s if wall_s > 0 else 0.0,
    }
    out.update(sim.ledger.stats())
    return out
