"""Benchmark: training time per step, tree-packed rows vs flat rows, same data, real megatron GPTModel (CPU).

Data: runs whose K paths share a prompt prefix of P tokens and branch into K outputs of B tokens (retries),
written as a TITO log and packed by the real pipeline (``build_batch``) in both modes. The shared-prefix
fraction ``f = 1 - tree_tokens / flat_tokens`` (the share of flat-mode tokens that tree mode does not compute)
is set by K and P/(P+B); every point has the same number of paths and flat tokens (``--paths`` x
``--path-len``), so flat mode costs about the same at every point. ``--synth`` adds the synthetic agent
workload (``synth_log`` defaults) for comparison.

Per point: one untimed exactness check (tree vs flat loss and gradients, max relative difference), then
``--warmup`` + ``--steps`` interleaved full steps (forward, backward, clip, AdamW) in each mode; medians of
the process CPU time and of the wall time per step.

    python benchmarks/bench_train_tree_vs_flat.py --threads 1
    python benchmarks/bench_train_tree_vs_flat.py --set model.hidden=256 --set model.layers=4
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import numpy as np


def fork_log(fraction: float, path_len: int, paths: int, vocab: int, seed: int):
    """A TITO log of runs with K retries of one prompt: f = (K-1)/K * P/(P+B) ≈ ``fraction``."""
    from gyre_hpc.trajectory.records import Call, Outcome, RunStatus, TitoLog

    K = 1 if fraction <= 0 else next(k for k in (2, 4, 8, 16, 32, 64) if (k - 1) / k >= fraction / 0.96 - 1e-9)
    if paths % (2 * K):
        raise SystemExit(f"--paths {paths} must be a multiple of 2 runs x {K} paths for fraction {fraction}")
    P = path_len - 1 if K == 1 else round(fraction * K / (K - 1) * path_len)
    B = path_len - P
    rng = np.random.default_rng(seed)
    calls, outcomes = [], []
    for run in range(paths // K):
        q, rid = f"q{run // 2}", f"q{run // 2}-r{run % 2}"
        prompt = rng.integers(0, vocab, P)
        for k in range(K):
            out = np.concatenate([[k % vocab], rng.integers(0, vocab, B - 1)]).astype(np.int64)
            calls.append(Call(rid, q, f"c{k}", prompt, out, np.full(B, -2.0), np.zeros(B, np.int64)))
        outcomes.append(Outcome(rid, q, RunStatus.SCORED, float(run % 2)))
    return TitoLog(tuple(calls), tuple(outcomes)), K, P, B


def step_times(trainer, batches: dict, warmup: int, steps: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per mode: (wall seconds, process CPU seconds) of each timed step. On a shared machine the CPU time is the
    steadier measure (other processes' load stretches wall time, not this process's CPU time)."""
    times = {m: ([], []) for m in batches}
    for i in range(warmup + steps):
        for mode, batch in sorted(batches.items(), reverse=bool(i % 2)):  # interleaved, ABBA: load hits both alike
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.step(batch)
            if i >= warmup:
                times[mode][0].append(time.perf_counter() - t0)
                times[mode][1].append(time.process_time() - c0)
    return times


def max_rel_diff(trainer, tree, flat) -> float:
    """Loss difference relative to Σ m|A||logp|/Z (group-normalised losses cancel), and per-parameter gradients."""
    import dataclasses

    lt, gt = trainer.loss_and_grads(tree)
    lf, gf = trainer.loss_and_grads(flat)
    scale = trainer.loss_and_grads(dataclasses.replace(flat, advantage=np.abs(flat.advantage)))[0]
    worst = abs(lt - lf) / scale
    for n in gf:
        worst = max(worst, float((gt[n] - gf[n]).norm() / gf[n].norm().clamp_min(1e-30)))
    return worst


def measure(name, log, cfg, traj, args) -> dict:
    from gyre_hpc.train.step import Trainer
    from gyre_hpc.trajectory.pipeline import build_batch

    tree, report = build_batch(log, traj, "tree")
    flat, _ = build_batch(log, traj, "flat")
    assert tree.trained_tokens == flat.trained_tokens == report.trained_tokens
    trainer = Trainer(cfg.model, cfg.train, seed=0)
    exact = max_rel_diff(trainer, tree, flat)
    times = step_times(trainer, {"tree": tree, "flat": flat}, args.warmup, args.steps)
    med = {(m, k): statistics.median(times[m][i]) for m in times for i, k in enumerate(("wall", "cpu"))}
    return dict(name=name, f=1 - report.tree_tokens / report.flat_tokens, tree_tokens=report.tree_tokens,
                flat_tokens=report.flat_tokens, trained=report.trained_tokens, tree_shape=tree.shape,
                flat_shape=flat.shape, exact=exact, ideal=report.flat_tokens / report.tree_tokens,
                **{f"{k}_{m}": v for (m, k), v in med.items()},
                ratio_wall=med["flat", "wall"] / med["tree", "wall"], ratio_cpu=med["flat", "cpu"] / med["tree", "cpu"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 0.9])
    ap.add_argument("--path-len", type=int, default=128, help="tokens per path (prefix + branch)")
    ap.add_argument("--paths", type=int, default=64, help="paths per batch (a multiple of 2 * 16)")
    ap.add_argument("--max-row-tokens", type=int, default=512, help="trajectory.max_row_tokens for both modes")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--synth", action="store_true", help="also measure synth_log(8, 4) with default knobs")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    args = ap.parse_args()

    import torch

    from gyre_hpc.config import load_config

    torch.set_num_threads(args.threads)
    cfg = load_config(None, [f"trajectory.max_row_tokens={args.max_row_tokens}", "trajectory.j_max=null",
                             *args.overrides])
    m = cfg.model
    print(f"# {datetime.date.today()} {platform.machine()} cpus={os.cpu_count()} threads={args.threads} "
          f"load={os.getloadavg()[0]:.1f} model: vocab {m.vocab_size}, hidden {m.hidden}, layers {m.layers}, "
          f"heads {m.heads}, {m.position_embedding}; max_row_tokens {args.max_row_tokens}; "
          f"{args.steps} steps after {args.warmup} warm-up, medians")
    print("| data | f (shared) | flat tokens | tree tokens | flat rows x len | tree rows x len | max rel diff "
          "| flat CPU s/step | tree CPU s/step | speed-up (CPU) | flat wall s | tree wall s | speed-up (wall) "
          "| token ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    points = []
    for f in args.fractions:
        log, K, P, B = fork_log(f, args.path_len, args.paths, m.vocab_size, seed=0)
        points.append((f"K={K} P={P} B={B}", log))
    if args.synth:
        from gyre_hpc.trajectory.synth import synth_log

        points.append(("synth_log(8, 4)", synth_log(8, 4, seed=0, vocab_size=m.vocab_size)))
    for name, log in points:
        r = measure(name, log, cfg, cfg.trajectory, args)
        print(f"| {r['name']} | {r['f']:.2f} | {r['flat_tokens']} | {r['tree_tokens']} | "
              f"{r['flat_shape'][0]}x{r['flat_shape'][1]} | {r['tree_shape'][0]}x{r['tree_shape'][1]} | "
              f"{r['exact']:.1e} | {r['cpu_flat']:.3f} | {r['cpu_tree']:.3f} | {r['ratio_cpu']:.2f} | "
              f"{r['wall_flat']:.3f} | {r['wall_tree']:.3f} | {r['ratio_wall']:.2f} | {r['ideal']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
