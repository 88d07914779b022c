"""Long-context training on the CPU: one forward + backward of the tiny model over 4 paths sharing half of each
path, packed as one tree row (``tree``) and as 4 flat rows (``flat``), at 4K-32K tree tokens.

Each (tokens, mode) point runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own. Tree attention
is the default core attention (``model.attention: tree``: no [T, T] tensor); ``max_rel_diff`` is the largest
relative difference between the two modes' loss and every parameter gradient (float32).

    python benchmarks/bench_long_context.py --json                  # {"rows": [...]}, ~5-10 min on 2 cores
    python benchmarks/bench_long_context.py --tokens 4096 8192      # a markdown table

Row: {"tokens": tree tokens T, "mode", "peak_rss_mib", "step_s", "step_cpu_s", "max_rel_diff"}; ``step_s`` is the
wall time of the step (after a warm-up step on 640 tokens), ``step_cpu_s`` its CPU time (on a shared machine the
honest one). A path is 2T/5 tokens: a shared
prefix of T/5 and a branch of T/5 (``tree`` computes T tokens, ``flat`` 8T/5).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

TOKENS = [4096, 8192, 16384, 32768]
MODEL = ["model.max_seq_len=32768"]


def fork_batches(T: int, seed: int = 0):
    """(tree, flat) ``PackedBatch`` of 4 paths: a prefix of T/5 tokens (its first token the prompt) and 4 branches."""
    from gyre_hpc.trajectory.batch import PackedBatch

    n = T // 5
    rng = np.random.default_rng(seed)
    prefix, branches = rng.integers(0, 256, n), [rng.integers(0, 256, T // 5 if b < 3 else T - 4 * n) for b in range(4)]

    def row(tokens, parent, loss):
        L = len(tokens)
        parent = np.asarray(parent, np.int64)
        pos, span = np.zeros(L, np.int64), np.arange(L, dtype=np.int64)
        for i in range(L):
            if parent[i] >= 0:
                pos[i] = pos[parent[i]] + 1
        for i in range(L - 1, 0, -1):
            if parent[i] >= 0:
                span[parent[i]] = max(span[parent[i]], span[i])
        loss = np.asarray(loss, np.float32)
        return dict(input_ids=np.asarray(tokens, np.int64), position_ids=pos, parent=parent, span_end=span,
                    loss_mask=loss, advantage=loss * 0.5, old_logprob=np.zeros(L, np.float32),
                    version=np.where(loss > 0, 0, -1))

    def stack(rows):
        L = max(len(r["input_ids"]) for r in rows)
        out = {}
        for k in rows[0]:
            pad = -1 if k in ("parent", "version") else 0
            a = np.full((len(rows), L), pad, dtype=rows[0][k].dtype)
            for i, r in enumerate(rows):
                a[i, : len(r[k])] = r[k]
            if k == "span_end":
                for i, r in enumerate(rows):
                    a[i, len(r[k]):] = np.arange(len(r[k]), L)
            out[k] = a
        return PackedBatch(**out, lengths=np.array([len(r["input_ids"]) for r in rows], np.int64)).validate()

    toks, par, loss = list(prefix), [-1] + list(range(n - 1)), [0.0] + [1.0] * (n - 1)
    flat = []
    for b, br in enumerate(branches):
        start = len(toks)
        toks += list(br)
        par += [n - 1] + list(range(start, start + len(br) - 1))
        loss += [1.0] * len(br)
        path = list(prefix) + list(br)
        flat.append(row(path, list(range(-1, len(path) - 1)), ([0.0] + [1.0 if b == 0 else 0.0] * (n - 1))
                        + [1.0] * len(br)))
    return stack([row(toks, par, loss)]), stack(flat)


def point(T: int, mode: str, out: str) -> None:
    """One fwd+bwd in this process; writes loss, grads and timings to ``out`` (npz)."""
    import torch

    from gyre_hpc.config import load_config
    from gyre_hpc.train.step import Trainer

    torch.set_num_threads(1)
    cfg = load_config(None, MODEL)
    tree, flat = fork_batches(T)
    batch = tree if mode == "tree" else flat
    trainer = Trainer(cfg.model, cfg.train, seed=0)
    trainer.loss_and_grads(fork_batches(640)[0 if mode == "tree" else 1])  # warm lazy imports and allocators
    t0, c0 = time.perf_counter(), time.process_time()
    loss, grads = trainer.loss_and_grads(batch)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    np.savez(out, loss=np.array(loss), step_s=np.array(dt), step_cpu_s=np.array(cpu), peak_rss_mib=np.array(rss),
             **{"g/" + k: v.numpy() for k, v in grads.items()})


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    ap.add_argument("--json", action="store_true", help='print {"rows": [...]} only')
    ap.add_argument("--point", nargs=3, metavar=("T", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        point(int(args.point[0]), args.point[1], args.point[2])
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in args.tokens:
            res = {}
            for mode in ("tree", "flat"):
                out = os.path.join(tmp, f"{T}-{mode}.npz")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--point", str(T), mode, out], check=True,
                               stdout=subprocess.DEVNULL)
                res[mode] = dict(np.load(out))
            a, b = res["tree"], res["flat"]
            diff = max([rel(a["loss"], b["loss"])] + [rel(a[k], b[k]) for k in b if k.startswith("g/")])
            for mode in ("tree", "flat"):
                r = dict(tokens=T, mode=mode, peak_rss_mib=round(float(res[mode]["peak_rss_mib"]), 1),
                         step_s=round(float(res[mode]["step_s"]), 3),
                         step_cpu_s=round(float(res[mode]["step_cpu_s"]), 3), max_rel_diff=diff)
                rows.append(r)
                if not args.json:
                    print(f"| {T} | {mode} | {r['peak_rss_mib']:.0f} | {r['step_s']:.2f} | {r['step_cpu_s']:.2f} | "
                          f"{diff:.1e} |", flush=True)
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
