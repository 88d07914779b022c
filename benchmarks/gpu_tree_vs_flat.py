"""GPU check: tree vs flat training throughput on a ~100M-parameter megatron GPTModel, one short script.

Same data as ``bench_train_tree_vs_flat.py`` (runs of K retries sharing a prompt, packed by the real pipeline
in both modes, shared-prefix fraction ``f = 1 - tree_tokens / flat_tokens``), the same Trainer (local layer
spec, dense tree masks, per-tree rows, length-grouped micro-batches), on one CUDA device in bf16 autocast.
Per fraction: a float32 exactness check (tree vs flat loss and gradients), then ``--warmup`` + ``--steps``
interleaved full steps per mode; medians; throughput counted in path tokens (flat tokens) per second, the
useful work both modes do.

    python benchmarks/gpu_tree_vs_flat.py --out results.json          # on a GPU machine (~2-4 min)
    python benchmarks/gpu_tree_vs_flat.py --long --out long.json      # 16K and 32K-token paths, f = 0.5, tree
    python benchmarks/gpu_tree_vs_flat.py --tiny --steps 2 --warmup 1   # checks the script on the CPU

``flop_ratio`` is the step's FLOP ratio flat / tree: 6 x params x tokens (dense layers, output layer) plus
12 x layers x hidden x attended pairs (QK and PV, forward + backward; a token attends its depth + 1 tokens in
either packing); ``efficiency`` = speed-up / flop_ratio (issue 28's targets: speed-up >= 1.7 at 512-token paths,
f = 0.5; efficiency >= 0.85 at 16K-32K-token paths). ``--long`` uses tree attention (``model.attention: tree``,
FlexAttention on CUDA: dense masks do not fit), ``train.recompute`` and the chunked output layer.
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


def step_flops(batch, params: int, layers: int, hidden: int) -> float:
    """Training FLOPs of one step over ``batch`` (see the module docstring)."""
    import numpy as np

    valid = np.arange(batch.shape[1])[None, :] < batch.lengths[:, None]
    pairs = float((batch.position_ids[valid] + 1).sum())
    return 6.0 * params * batch.tokens + 12.0 * layers * hidden * pairs


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
    ap.add_argument("--path-len", type=int, nargs="+", default=[512])
    ap.add_argument("--long", action="store_true",
                    help="16K and 32K-token paths at f = 0.5, tree attention only, recompute on")
    ap.add_argument("--paths", type=int, default=64)
    ap.add_argument("--micro-batch-tokens", type=int, default=32768)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype for timed steps")
    ap.add_argument("--attention", nargs="+", choices=["local", "sdpa", "tree"], default=["local", "sdpa", "tree"],
                    help="core attention(s) to measure (model.attention)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here (atomically)")
    args = ap.parse_args()

    import torch

    from gyre_hpc.config import load_config
    from gyre_hpc.files.io import atomic_write_json
    from gyre_hpc.train.step import Trainer
    from gyre_hpc.trajectory.pipeline import build_batch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("no CUDA device: run with --tiny to check the script on the CPU", file=sys.stderr)
        return 2
    extra = []
    if args.long:
        args.path_len, args.paths, args.fractions, args.attention = [16384, 32768], 8, [0.5], ["tree"]
        args.micro_batch_tokens = max(args.micro_batch_tokens, 65536)
        extra = ["model.max_seq_len=32768", "train.recompute=true"]
    if args.tiny:
        args.path_len, args.paths = [min(n, 64) for n in args.path_len], min(args.paths, 32)
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    cfg = load_config(None, (MODEL_TINY if args.tiny else MODEL_100M) + [
        "trajectory.j_max=null", f"trajectory.max_row_tokens={64 * max(args.path_len)}",
        f"train.micro_batch_tokens={args.micro_batch_tokens}", "train.lr=1.0e-5"] + extra)
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    use_bf16 = args.dtype == "bf16" and cuda
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    head = dict(device=device, torch=torch.__version__, dtype=args.dtype if cuda else "fp32",
                path_lens=args.path_len, paths=args.paths, steps=args.steps, warmup=args.warmup,
                micro_batch_tokens=args.micro_batch_tokens, date=time.strftime("%Y-%m-%d"))
    print("#", json.dumps(head), flush=True)
    print("| attention | path | f | K P B | flat tokens | tree tokens | exact (fp32) | flat s/step | tree s/step | "
          "flat tok/s | tree tok/s (path tokens) | speed-up | token ratio | FLOP ratio | efficiency |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for attention in args.attention:
        model_cfg = dataclasses.replace(cfg.model, attention=attention)
        trainer = Trainer(model_cfg, cfg.train, seed=0)
        head["params"] = params = sum(p.numel() for p in trainer.model.parameters())
        for path_len, f in [(n, f) for n in args.path_len for f in args.fractions]:
            log, K, P, B = fork_log(f, path_len, args.paths, cfg.model.vocab_size, seed=0)
            tree, rep = build_batch(log, cfg.trajectory, "tree")
            flat, _ = build_batch(log, cfg.trajectory, "flat")
            exact = max_rel_diff(trainer, tree, flat)
            t = timed_steps(trainer, {"tree": tree, "flat": flat}, args.warmup, args.steps, autocast, sync)
            flops = {m: step_flops(b, params, cfg.model.layers, cfg.model.hidden) for m, b in
                     (("tree", tree), ("flat", flat))}
            r = dict(attention=attention, path_len=path_len, f=1 - rep.tree_tokens / rep.flat_tokens, K=K, P=P,
                     B=B, flat_tokens=rep.flat_tokens, tree_tokens=rep.tree_tokens, exact=exact, t_flat=t["flat"],
                     t_tree=t["tree"], speedup=t["flat"] / t["tree"], token_ratio=rep.flat_tokens / rep.tree_tokens,
                     flop_ratio=flops["flat"] / flops["tree"])
            r["efficiency"] = r["speedup"] / r["flop_ratio"]
            rows.append(r)
            print(f"| {attention} | {path_len} | {r['f']:.2f} | {K} {P} {B} | {r['flat_tokens']} | "
                  f"{r['tree_tokens']} | {exact:.1e} | {r['t_flat']:.4f} | {r['t_tree']:.4f} | "
                  f"{r['flat_tokens'] / r['t_flat']:.0f} | {r['flat_tokens'] / r['t_tree']:.0f} | {r['speedup']:.2f} | "
                  f"{r['token_ratio']:.2f} | {r['flop_ratio']:.2f} | {r['efficiency']:.2f} |", flush=True)
        del trainer
    if cuda:
        head["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.out:
        atomic_write_json(args.out, {**head, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
