"""Predictions with their uncertainty: a band over seeds (and perturbed inputs), and one-at-a-time sensitivity.

``band(cfg, seeds, perturb)``: the comparison is repeated for ``seeds`` workload seeds (``run.seed + k``); with
``perturb = f > 0`` every sample also draws each input of ``INPUTS`` from ``value x U(1 - f, 1 + f)`` (the
sampling rng is seeded by the sample index, so the band is reproducible). Per policy it reports the median,
min, max, p10 and p90 of the hours and of its ratio to gyre. A trace workload does not change with the seed;
only the perturbed inputs then widen the band.

``sensitivity(cfg, frac)``: each input of ``INPUTS`` in turn at ``x (1 - frac)`` and ``x (1 + frac)``, all
others at the config's values and seed; the effect of an input is the largest relative change of any
policy's hours, and the inputs are ranked by it. Inputs that the workload does not use (the parametric
model's when a trace is given) are skipped.

Invariants
- Same config, seeds and perturbation → the same band (deterministic).
- The band's median lies between its min and max; with seeds = 1 and perturb = 0 it is the point prediction.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.config import GyreConfig, apply_overrides, build, to_dict

#: inputs whose uncertainty is propagated: the workload model's and the cell physics' measured quantities
WORKLOAD_INPUTS = ("workload.turns_median", "workload.query_sigma", "workload.run_sigma",
                   "workload.stuck_query_frac", "workload.tool_s_per_turn", "workload.decode_tokens_per_turn",
                   "workload.prefill_tokens_per_turn")
SIM_INPUTS = ("sim.decode_tok_s", "sim.train_tok_s_per_cell", "sim.half_load", "sim.optimizer_s")


def inputs(cfg: GyreConfig) -> tuple[str, ...]:
    return SIM_INPUTS if cfg.workload.trace is not None else WORKLOAD_INPUTS + SIM_INPUTS


def _get(cfg: GyreConfig, key: str) -> float:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _with(cfg: GyreConfig, sets: list[str]) -> Any:
    return build(type(cfg), apply_overrides(to_dict(cfg), sets, type(cfg)))


def _scaled(cfg: GyreConfig, factors: dict[str, float]) -> Any:
    sets = []
    for key, f in factors.items():
        v = _get(cfg, key) * f
        if key == "workload.stuck_query_frac":
            v = min(v, 0.95)
        sets.append(f"{key}={v!r}")
    return _with(cfg, sets)


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max()),
            "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90))}


def band(cfg: GyreConfig, seeds: int, perturb: float = 0.0) -> dict[str, Any]:
    """Per policy: ``{"hours": stats, "vs_gyre": stats}`` over ``seeds`` samples (module docstring)."""
    hours: dict[str, list[float]] = {name: [] for name in cfg.sim.policies}
    keys = inputs(cfg)
    for k in range(seeds):
        sample = _with(cfg, [f"run.seed={cfg.run.seed + k}"])
        if perturb > 0:
            rng = np.random.default_rng(k)
            sample = _scaled(sample, {key: float(rng.uniform(1 - perturb, 1 + perturb)) for key in keys})
        result, _ = compare(sample)
        for name, r in result["policies"].items():
            hours[name].append(r["hours"])
    out: dict[str, Any] = {"seeds": seeds, "perturb": perturb, "policies": {}}
    for name, hs in hours.items():
        entry = {"hours": _stats(hs)}
        if "gyre" in hours:
            entry["vs_gyre"] = _stats([h / g for h, g in zip(hs, hours["gyre"])])
        out["policies"][name] = entry
    return out


def sensitivity(cfg: GyreConfig, frac: float) -> list[dict[str, Any]]:
    """Inputs ranked by the largest relative change (%) of any policy's hours at ``x (1 +- frac)``."""
    base, _ = compare(cfg)
    base_h = {n: r["hours"] for n, r in base["policies"].items()}
    rows = []
    for key in inputs(cfg):
        if _get(cfg, key) == 0:
            continue  # scaling zero moves nothing (e.g. no stuck queries)
        change: dict[str, list[float]] = {}
        for f in (1 - frac, 1 + frac):
            result, _ = compare(_scaled(cfg, {key: f}))
            for n, r in result["policies"].items():
                change.setdefault(n, []).append(100.0 * (r["hours"] - base_h[n]) / base_h[n])
        worst = max(abs(x) for xs in change.values() for x in xs)
        rows.append({"input": key, "frac": frac, "hours_change_pct": change, "max_abs_pct": worst})
    return sorted(rows, key=lambda r: -r["max_abs_pct"])
