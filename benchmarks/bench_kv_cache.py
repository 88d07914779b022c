"""Local-engine decode speed with the paged KV cache against the recompute-every-tick path, at a long context.

The real scheduler and megatron policy run in this process (no HTTP: the engine's own work only). Each repeat
generates ``--new-tokens`` greedy tokens for ``--concurrency`` requests of ``--context`` prompt tokens each, once
without the cache and once with it (alternating which goes first), on fresh random prompts (no prefix hits: the
cache's prefill is counted). Prints the median tokens/s of each and the ratio; ``--json`` prints one object.

    python benchmarks/bench_kv_cache.py --context 1024 --new-tokens 32 --concurrency 4 --repeats 5
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from gyre_hpc.config import EngineConfig, ModelConfig
    from gyre_hpc.localengine.policy import MegatronPolicy
    from gyre_hpc.engines.protocol import parse_generate
    from gyre_hpc.localengine.scheduler import Scheduler

    total = args.context + args.new_tokens
    model = ModelConfig(hidden=args.hidden, layers=args.layers, ffn=4 * args.hidden, max_seq_len=total + 16)
    plain = EngineConfig(max_running_requests=args.concurrency, context_len=total)
    cached = dataclasses.replace(plain, kv_cache=True, kv_pool_tokens=args.concurrency * total + 256)
    policy = MegatronPolicy(model, seed=0, threads=args.threads)
    rng = np.random.default_rng(0)

    def serve(cfg, prompts) -> tuple[float, list]:
        async def run():
            sched = Scheduler(policy, cfg)
            loop = asyncio.create_task(sched.run())
            try:
                reqs = [parse_generate({"input_ids": p, "sampling_params": {
                    "max_new_tokens": args.new_tokens, "temperature": 0.0}}, model.vocab_size) for p in prompts]
                t0 = time.perf_counter()
                out = await asyncio.gather(*(sched.generate(r) for r in reqs))
                return time.perf_counter() - t0, [o["output_ids"] for o in out]
            finally:
                loop.cancel()
                await asyncio.gather(loop, return_exceptions=True)
        return asyncio.run(run())

    speeds = {"plain": [], "cached": []}
    identical = True
    for rep in range(args.repeats):
        prompts = [rng.integers(0, model.vocab_size, args.context).tolist() for _ in range(args.concurrency)]
        order = [("plain", plain), ("cached", cached)]
        outs = {}
        for name, cfg in (order if rep % 2 == 0 else order[::-1]):
            wall, outs[name] = serve(cfg, prompts)
            speeds[name].append(args.concurrency * args.new_tokens / wall)
        identical &= outs["plain"] == outs["cached"]
    med = {k: statistics.median(v) for k, v in speeds.items()}
    result = {"context": args.context, "new_tokens": args.new_tokens, "concurrency": args.concurrency,
              "hidden": args.hidden, "layers": args.layers, "repeats": args.repeats,
              "plain_tok_s": round(med["plain"], 1), "cached_tok_s": round(med["cached"], 1),
              "ratio": round(med["cached"] / med["plain"], 2), "identical": identical,
              "per_repeat": {k: [round(x, 1) for x in v] for k, v in speeds.items()}}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"context {args.context}, {args.concurrency} requests x {args.new_tokens} tokens, "
              f"hidden {args.hidden} x {args.layers} layers, median of {args.repeats}:")
        print(f"  without cache {result['plain_tok_s']} tok/s, with cache {result['cached_tok_s']} tok/s "
              f"({result['ratio']}x), greedy tokens identical: {identical}")


if __name__ == "__main__":
    main()
