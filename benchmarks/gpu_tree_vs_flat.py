"""GPU check: tree vs flat training throughput on a ~100M-parameter megatron GPTModel, one short script.

Same data as ``bench_train_tree_vs_flat.py`` (runs of K retries sharing a prompt, packed by the real pipeline
in both modes, shared-prefix fraction ``f = 1 - tree_tokens / flat_tokens``), the same Trainer (local layer
spec, dense tree masks, per-tree rows, length-grouped micro-batches), on one CUDA device in bf16 autocast.
Per fraction: a float32 exactness check (tree vs flat loss and gradients), then ``--warmup`` + ``--steps``
interleaved full steps per mode; medians; throughput counted in path tokens (flat tokens) per second, the
useful work both modes do.

    python benchmarks/gpu_tree_vs_flat.py --out results.json          # on a GPU machine (~2-4 min)
    python benchmarks/gpu_tree_vs_flat.py --tiny --steps 2 --warmup 1   # checks the script on the CPU
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_train_tree_vs_flat import fork_log, max_rel_diff  # noqa: E402

MODEL_100M = ["model.vocab_size=32000", "model.hidden=768", "model.layers=12", "model.heads=12",
              "model.ffn=2048", "model.max_seq_len=4096", "model.tie_embeddings=true"]
MODEL_TINY = ["model.max_seq_len=4096"]


def timed_steps(trainer, batches, warmup, steps, autocast, sync):
    times = {m: [] for m in batches}
    for i in range(warmup + steps):
        for mode, batch in sorted(batches.items(), reverse=bool(i % 2)):  # ABBA order
            sync()
            t0 = time.perf_counter()
            with autocast():
                trainer.step(batch)
            sync()
            if i >= warmup:
                times[mode].append(time.perf_counter() - t0)
    return {m: statistics.median(t) for m, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model on whatever device exists (CPU check)")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.5, 0.75, 0.9])
    ap.add_argument("--path-len", type=int, default=512)
    ap.add_argument("--paths", type=int, default=64)
    ap.add_argument("--micro-batch-tokens", type=int, default=32768)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype for timed steps")
    ap.add_argument("--attention", nargs="+", choices=["local", "sdpa"], default=["local", "sdpa"],
                    help="core attention(s) to measure (model.attention)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here (atomically)")
    args = ap.parse_args()

    import torch

    from gyre_hpc.config import load_config
    from gyre_hpc.io import atomic_write_json
    from gyre_hpc.train.step import Trainer
    from gyre_hpc.trajectory.pipeline import build_batch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("no CUDA device: run with --tiny to check the script on the CPU", file=sys.stderr)
        return 2
    if args.tiny:
        args.path_len, args.paths = min(args.path_len, 64), min(args.paths, 32)
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    cfg = load_config(None, (MODEL_TINY if args.tiny else MODEL_100M) + [
        "trajectory.j_max=null", f"trajectory.max_row_tokens={64 * args.path_len}",
        f"train.micro_batch_tokens={args.micro_batch_tokens}", "train.lr=1.0e-5"])
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    use_bf16 = args.dtype == "bf16" and cuda
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    head = dict(device=device, torch=torch.__version__, dtype=args.dtype if cuda else "fp32",
                path_len=args.path_len, paths=args.paths, steps=args.steps, warmup=args.warmup,
                micro_batch_tokens=args.micro_batch_tokens, date=time.strftime("%Y-%m-%d"))
    print("#", json.dumps(head), flush=True)
    print("| attention | f | K P B | flat tokens | tree tokens | exact (fp32) | flat s/step | tree s/step | "
          "flat tok/s | tree tok/s (path tokens) | speed-up | token ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for attention in args.attention:
        model_cfg = dataclasses.replace(cfg.model, attention=attention)
        trainer = Trainer(model_cfg, cfg.train, seed=0)
        head["params"] = sum(p.numel() for p in trainer.model.parameters())
        for f in args.fractions:
            log, K, P, B = fork_log(f, args.path_len, args.paths, cfg.model.vocab_size, seed=0)
            tree, rep = build_batch(log, cfg.trajectory, "tree")
            flat, _ = build_batch(log, cfg.trajectory, "flat")
            exact = max_rel_diff(trainer, tree, flat)
            t = timed_steps(trainer, {"tree": tree, "flat": flat}, args.warmup, args.steps, autocast, sync)
            r = dict(attention=attention, f=1 - rep.tree_tokens / rep.flat_tokens, K=K, P=P, B=B,
                     flat_tokens=rep.flat_tokens, tree_tokens=rep.tree_tokens, exact=exact, t_flat=t["flat"],
                     t_tree=t["tree"], speedup=t["flat"] / t["tree"], token_ratio=rep.flat_tokens / rep.tree_tokens)
            rows.append(r)
            print(f"| {attention} | {r['f']:.2f} | {K} {P} {B} | {r['flat_tokens']} | {r['tree_tokens']} | "
                  f"{exact:.1e} | {r['t_flat']:.4f} | {r['t_tree']:.4f} | {r['flat_tokens'] / r['t_flat']:.0f} | "
                  f"{r['flat_tokens'] / r['t_tree']:.0f} | {r['speedup']:.2f} | {r['token_ratio']:.2f} |", flush=True)
        del trainer
    if cuda:
        head["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.out:
        atomic_write_json(args.out, {**head, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
