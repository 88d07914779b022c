"""A run's KV blocks moved to another engine over Mooncake Transfer Engine, against re-prefilling its context there.

Two ``PagedDecoder``s over the same megatron policy (hidden 512, 8 layers by default) and two ``KVPort``s (the local
engine's Mooncake port: registered staging buffer, ONE batched read over loopback TCP) run in this process. Per
context length and repeat, a source prefills ``context`` random tokens, decodes 8 greedy tokens and releases the
request (as the proxy's abort does: its full blocks stay in the prefix cache). Then, each to the first new token
on a fresh target:

- ``move_s``: export the cached blocks, stage, pull (one batched transfer), verify and import, then the first
  decode step (it recomputes only the tail after the last full block);
- ``reprefill_s``: the first step of the same tokens on a target without them (chunked prefill of the context).

``identical``: the moved target's next ``--check-tokens`` greedy tokens equal the source's (unmoved) ones.
``--json`` prints ``{"rows": [{"context", "move_s", "reprefill_s", "bytes", "identical", ...}]}`` (medians).

    python benchmarks/bench_kv_move.py --json                         # contexts 1024 4096 16384
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

B = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=3, help="repeats per context (1 at >= 16K unless --repeats-long)")
    ap.add_argument("--repeats-long", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--check-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from gyre_hpc.config import ModelConfig, TransferConfig
    from gyre_hpc.localengine.kvport import KVPort
    from gyre_hpc.localengine.kvprefix import bundle_from, export_prefix, import_prefix
    from gyre_hpc.localengine.policy import MegatronPolicy

    top = max(args.contexts) + 64
    model = ModelConfig(hidden=args.hidden, layers=args.layers, heads=8, ffn=4 * args.hidden, max_seq_len=top)
    policy = MegatronPolicy(model, seed=0, threads=args.threads)
    ports = KVPort(TransferConfig()), KVPort(TransferConfig())
    rng = np.random.default_rng(0)

    def greedy(dec, rid, tokens, n):
        tokens = list(tokens)
        dec.admit(rid, tokens, len(tokens) + n + 1, "0")
        t0, first = time.perf_counter(), None
        for _ in range(n):
            row = dec.step([(rid, tokens)])[0]
            dec.commit([(rid, tokens)], "0")
            tokens.append(int(row.argmax()))
            first = first if first is not None else time.perf_counter() - t0
        dec.release(rid)
        return tokens, first

    rows = []
    for ctx in args.contexts:
        runs = []
        for rep in range(args.repeats_long if ctx >= 16384 else args.repeats):
            pool = ctx + 64
            src = policy.paged(B, pool, 1024)
            cut, _ = greedy(src, "s", rng.integers(0, model.vocab_size, ctx).tolist(), 8)
            unmoved, _ = greedy(src, "u", cut, args.check_tokens)
            dst = policy.paged(B, pool, 1024)
            t0 = time.perf_counter()
            bundle = export_prefix(src, cut, "0")
            desc = ports[0].stage(bundle)
            raw = ports[1].pull(desc)
            from_wire = bundle_from(desc, raw)
            import_prefix(dst, from_wire, "0")
            transfer_s = time.perf_counter() - t0
            moved, first = greedy(dst, "m", cut, args.check_tokens)
            move_s = transfer_s + first
            ports[0].release(desc["move_id"])
            del src, dst, bundle, raw, from_wire
            fresh = policy.paged(B, pool, 1024)
            _, reprefill_s = greedy(fresh, "r", cut, 1)
            del fresh
            runs.append({"move_s": move_s, "transfer_s": transfer_s, "reprefill_s": reprefill_s,
                         "bytes": desc["nbytes"], "identical": moved == unmoved, "moved_tokens": len(desc["tokens"])})
        med = {k: statistics.median(r[k] for r in runs) for k in ("move_s", "transfer_s", "reprefill_s")}
        rows.append({"context": ctx, **{k: round(v, 4) for k, v in med.items()}, "bytes": runs[0]["bytes"],
                     "identical": all(r["identical"] for r in runs), "repeats": len(runs),
                     "ratio_reprefill_over_move": round(statistics.median(r["reprefill_s"] / r["move_s"] for r in runs), 2),
                     "per_repeat": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                                    for r in runs]})
        if not args.json:
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_repeat"}), flush=True)
    if args.json:
        print(json.dumps({"model": {"hidden": args.hidden, "layers": args.layers, "block_size": B}, "rows": rows}))


if __name__ == "__main__":
    main()
