"""Fit the simulator's free parameters so the paper's 2.4T table is reproduced (docs/simulator.md).

Targets (QwenGyre, 2.4T, 48 steps): gyre 75.42 h, async 134.55 h, colocate 91.47 h; 61.1% of queries
last >= 4 h and the longest run hits the timeout in 38.2% of queries (durations measured under gyre).

Method: damped Gauss-Newton (Levenberg-Marquardt) on five residuals — log(hours / target) per policy and
10 x (fraction - target) for the two workload statistics — over the free parameters in log space, with a
forward-difference Jacobian. Every evaluation is a full ``compare`` of the three policies.

Usage: python benchmarks/fit_paper.py configs/sim/paper_2p4t.yaml [--iters 6] [--set k=v ...]
Prints the fitted ``key=value`` overrides (copy them into the YAML) and the numbers after each iteration.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.config import load_config

TARGET_HOURS = {"gyre": 75.42, "colocate": 91.47, "async": 134.55}
TARGET_STATS = {"frac_queries_ge_4h": 0.611, "frac_queries_hit_timeout": 0.382}

#: free key → (lower, upper, integer?)
FREE = {
    "workload.timeout_h": (4.2, 8.0, False),
    "workload.turns_median": (100.0, 600.0, False),
    "workload.stuck_query_frac": (0.02, 0.5, False),
    "workload.query_sigma": (0.1, 1.2, False),
    "workload.run_sigma": (0.05, 0.8, False),
    "workload.path_turns": (5.0, 100.0, False),
    "sim.half_load": (32.0, 4096.0, False),
    "sim.train_tok_s_per_cell": (1e4, 3e5, False),
    "scheduler.capacity_runs_per_cell": (64, 512, True),
}
TIED = {"scheduler.capacity_runs_per_cell": "sim.kv_slots_per_cell"}


def overrides(x: dict[str, float]) -> list[str]:
    out = []
    for k, v in x.items():
        v = int(round(v)) if FREE[k][2] else float(f"{v:.4g}")
        out += [f"{k}={v}"] + ([f"{TIED[k]}={v}"] if k in TIED else [])
    return out


def residuals(path: str, extra: list[str], x: dict[str, float]) -> tuple[np.ndarray, dict]:
    result, _ = compare(load_config(path, extra + overrides(x)))
    r = [math.log(result["policies"][p]["hours"] / h) for p, h in TARGET_HOURS.items()]
    r += [10.0 * (result["workload"][k] - v) for k, v in TARGET_STATS.items()]
    return np.array(r), result


def fit(path: str, extra: list[str], iters: int) -> dict[str, float]:
    cfg = load_config(path, extra)
    keys = list(FREE)
    x = {k: float(getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1])) for k in keys}
    r, res = residuals(path, extra, x)
    lam, h = 1.0, 0.08
    for it in range(iters):
        u = np.log([x[k] for k in keys])
        jac = np.zeros((r.size, len(keys)))
        for j, k in enumerate(keys):
            y = dict(x)
            y[k] = min(FREE[k][1], max(FREE[k][0], x[k] * math.exp(h)))
            step = math.log(y[k] / x[k]) or -h
            if step == -h:
                y[k] = x[k] * math.exp(-h)
            jac[:, j] = (residuals(path, extra, y)[0] - r) / step
        while lam < 1e4:
            delta = np.linalg.solve(jac.T @ jac + lam * np.eye(len(keys)), -jac.T @ r)
            delta = np.clip(delta, -0.5, 0.5)
            y = {k: float(min(FREE[k][1], max(FREE[k][0], math.exp(v)))) for k, v in zip(keys, u + delta)}
            r_y, res_y = residuals(path, extra, y)
            if r_y @ r_y < r @ r:
                x, r, res, lam = y, r_y, res_y, lam / 3
                break
            lam *= 4
        hours = {p: round(res["policies"][p]["hours"], 2) for p in TARGET_HOURS}
        stats = {k: round(res["workload"][k], 3) for k in TARGET_STATS}
        print(f"iter {it}: |r|^2 {r @ r:.4f} {hours} {stats} " + " ".join(overrides(x)), file=sys.stderr, flush=True)
        if np.abs(r[:3]).max() < 0.01 and np.abs(r[3:]).max() < 0.1:
            break
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="starting overrides")
    args = ap.parse_args()
    t0 = time.time()
    x = fit(args.config, args.extra, args.iters)
    print("\n".join(overrides(x)))
    print(f"# fitted in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
