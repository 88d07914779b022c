"""Benchmark: prefix sharing and trained-once dedup on the synthetic agent workload.

For the default workload (``synth_log`` defaults, ``--queries`` x ``--runs``) and a longer, branchier one,
at J_max = 5 and unlimited:

- tree_tokens / flat_tokens: tokens the model computes in tree mode vs one sample per path;
- trained tokens vs a naive flattening that trains every generated token of every path (shared outputs counted
  once per path that holds them);
- build_batch wall time in tree and flat mode (median of ``--repeats``, same process).

    python benchmarks/bench_dedup.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.trajectory.pipeline import build_batch, plan
from gyre_hpc.trajectory.select import generated_per_leaf
from gyre_hpc.trajectory.synth import synth_log

PRESETS = {
    "default": {},
    "long": dict(turns=(10, 30), output_len=(20, 200), tool_len=(20, 400), retry_prob=0.2, compression_prob=0.05,
                 subagent_prob=0.05, subagent_turns=(2, 6)),
}


def naive_trained(p) -> int:
    """Generated tokens summed over kept paths (a shared output counted once per path)."""
    return sum(int(generated_per_leaf(it.tree)[list(it.leaves)].sum()) for it in p.items)


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.queries} queries x {args.runs} "
          f"runs, seed {args.seed}")
    print("| workload | J_max | runs trained | paths (dropped) | flat_tokens | tree_tokens | tree/flat | trained | "
          "naive trained | trained/naive | tree build_batch | flat build_batch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, knobs in PRESETS.items():
        log = synth_log(args.queries, args.runs, seed=args.seed, **knobs)
        for j_max in (5, None):
            cfg = TrajectoryConfig(j_max=j_max, max_row_tokens=1 << 20)
            p = plan(log, cfg)
            r = p.report
            naive = naive_trained(p)
            t_tree = median_time(lambda: build_batch(log, cfg, "tree"), args.repeats)
            t_flat = median_time(lambda: build_batch(log, cfg, "flat"), args.repeats)
            print(f"| {name} | {j_max} | {r.runs_trained} | {r.paths} ({r.paths_dropped}) | {r.flat_tokens:,} | "
                  f"{r.tree_tokens:,} | {r.tree_tokens / r.flat_tokens:.3f} | {r.trained_tokens:,} | {naive:,} | "
                  f"{r.trained_tokens / naive:.3f} | {t_tree * 1e3:.0f} ms | {t_flat * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
