"""Benchmark: prefix tree + packed tree masks of one long branching run (claim: >= 20 M tokens/s, 2-core CPU).

The run has ``--tokens`` tree tokens and ``--paths`` leaves: a shared trunk (20 % of the tokens) and one branch
per path that retries the trunk's next call (diverging at its first output token). Each trunk or branch segment
is ``--calls`` model calls (turns of half tool input, half output); a call's input is its whole context, so the
log holds more tokens than the tree (``log tokens``, reported too).

Timed (median of ``--repeats``): ``build_tree`` + ``pack_tree`` of all paths into one row (tokens, parent,
span_end = the tree attention mask, position ids = depths, loss mask, advantages, logprobs, versions).
Throughput = tree tokens / second, wall clock and CPU time of the process (the CPU is shared). Baseline in the
same run: a per-token Python trie (dict of dicts) inserting every call sequence. Peak memory: tracemalloc peak
of one extra untimed run, and the process's max RSS.

Each measurement runs in a child process twice: with glibc's default malloc, which returns freed arrays to the
kernel so every build pays first-touch page faults again (costly on this VM), and with malloc tunables that
keep freed memory for reuse (what a long-lived trainer process should set).

    python benchmarks/bench_tree.py                   # 1,000,000 tokens, 5 paths, 1 call per segment
    python benchmarks/bench_tree.py --calls 10        # 10 calls per segment (quadratic log, same tree)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from gyre_hpc.trajectory.packing import RunItem, pack_flat, pack_tree
from gyre_hpc.trajectory.records import Call
from gyre_hpc.trajectory.tree import build_tree


def segment_calls(rng, run_id, context, n_tokens, n_calls, first_out, start, leaf):
    """``n_calls`` turns adding ``n_tokens`` after ``context`` (a leaf segment ends on an output, with no tool
    answer after it); returns (calls, final context)."""
    calls = []
    per = max(2, n_tokens // n_calls)
    for i in range(n_calls):
        last = leaf and i == n_calls - 1
        out = rng.integers(0, 50_000, per if last else per // 2)
        if i == 0 and first_out is not None:
            out[0] = first_out
        lp = -rng.random(len(out))
        calls.append(Call(run_id, "q0", f"c{start + i}", context, out, lp, np.zeros(len(out), np.int64)))
        tool = rng.integers(0, 50_000, per - per // 2)
        context = np.concatenate([context, out, tool])
    return calls, context


def make_run(tokens: int, paths: int, n_calls: int, seed: int = 0) -> list[Call]:
    rng = np.random.default_rng(seed)
    trunk_len = tokens // 5
    branch_len = (tokens - trunk_len) // paths
    system = rng.integers(0, 50_000, 64)
    calls, ctx = segment_calls(rng, "q0-r0", system, trunk_len - 64, n_calls, None, 0, leaf=False)
    for p in range(paths):
        more, _ = segment_calls(rng, "q0-r0", ctx, branch_len, n_calls, p, len(calls), leaf=True)
        calls += more
    return calls


def naive_trie(calls) -> int:
    root, nodes = {}, 0
    for c in calls:
        node = root
        for tok in c.sequence.tolist():
            if tok not in node:
                node[tok] = {}
                nodes += 1
            node = node[tok]
    return nodes


def timed(fn, repeats):
    """(median wall seconds, median CPU seconds of this process, last result)."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), out


TUNED = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def measure(args) -> dict:
    calls = make_run(args.tokens, args.paths, args.calls)
    log_tokens = sum(len(c.input_ids) + len(c.output_ids) for c in calls)

    def tree_and_masks():
        tree = build_tree(calls)
        return pack_tree([RunItem("q0-r0", tree, tuple(range(tree.n_leaves)), 1.0)], 10 ** 9), tree

    wall, cpu, (batch, tree) = timed(tree_and_masks, args.repeats)
    build_wall, _, _ = timed(lambda: build_tree(calls), args.repeats)
    item = RunItem("q0-r0", tree, tuple(range(tree.n_leaves)), 1.0)
    flat_wall, _, flat = timed(lambda: pack_flat([item], 10 ** 9), args.repeats)
    assert tree.n_leaves == args.paths and flat.trained_tokens == batch.trained_tokens
    out = dict(tree_tokens=batch.tokens, calls=len(calls), log_tokens=log_tokens, flat_tokens=flat.tokens,
               trained=batch.trained_tokens, wall=wall, cpu=cpu, build_wall=build_wall, flat_wall=flat_wall)
    if args.baseline_repeats:
        out["naive_wall"], _, naive_nodes = timed(lambda: naive_trie(calls), args.baseline_repeats)
        assert naive_nodes == batch.tokens, (naive_nodes, batch.tokens)
    tracemalloc.start()
    tree_and_masks()
    out["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def report(name: str, r: dict, repeats: int) -> None:
    n = r["tree_tokens"]
    print(f"[{name}] build_tree + pack_tree, median of {repeats}: wall {r['wall'] * 1e3:.1f} ms = "
          f"{n / r['wall'] / 1e6:.1f} M tree tokens/s ({r['log_tokens'] / r['wall'] / 1e6:.0f} M log tokens/s); "
          f"CPU {r['cpu'] * 1e3:.1f} ms = {n / r['cpu'] / 1e6:.1f} M tree tokens/s")
    print(f"    build_tree alone {r['build_wall'] * 1e3:.1f} ms; pack_flat of the same paths "
          f"{r['flat_wall'] * 1e3:.1f} ms; peak memory: tracemalloc {r['tracemalloc_peak'] / 2 ** 20:.0f} MiB, "
          f"max RSS {r['max_rss'] / 2 ** 20:.0f} MiB")
    if "naive_wall" in r:
        print(f"    baseline per-token Python trie: {r['naive_wall'] * 1e3:.0f} ms = {n / r['naive_wall'] / 1e6:.2f} M "
              f"tree tokens/s; speed-up {r['naive_wall'] / r['wall']:.0f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--paths", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1, help="calls per trunk/branch segment")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--baseline-repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results = {}
    for name, env, base in (("default glibc malloc", {}, args.baseline_repeats), ("malloc tunables", TUNED, 0)):
        cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens), "--paths", str(args.paths),
               "--calls", str(args.calls), "--repeats", str(args.repeats), "--baseline-repeats", str(base)]
        out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout)
    r = results["default glibc malloc"]
    print(f"run: {r['tree_tokens']:,} tree tokens, {args.paths} paths, {r['calls']} calls, {r['log_tokens']:,} log "
          f"tokens, {r['flat_tokens']:,} flat tokens, {r['trained']:,} trained")
    for name, r in results.items():
        report(name, r, args.repeats)
    print("malloc tunables: " + " ".join(f"{k}={v}" for k, v in TUNED.items()))


if __name__ == "__main__":
    main()
