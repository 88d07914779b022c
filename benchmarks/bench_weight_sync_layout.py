"""Weight-sync time by trainer layout (TP x PP -> engine TP 1): bucketed resharding against gather-everything.

For each layout (trainer TP 1/2, PP 1/2; spawned gloo ranks on this machine) and each model size, the trainer's
ranks push their weights into one running local engine (engine TP 1, a real process on 127.0.0.1) by two roads,
interleaved repeat by repeat (A, B, A, B, ...) so that the shared machine's noise hits both alike:

- ``bucketed``: ``train.reshard.push_resharded`` with a bucket below one layer (``BUCKET_MB``, or ``--bucket-mb``):
  per bucket, TP shards gathered to the stage's TP rank 0, later stages' tensors sent to the sender, converted to
  HF names, one ``/update_weights_from_distributed`` call and its gloo broadcasts; no rank holds more than one
  bucket of full tensors;
- ``gather_all`` (the baseline): the same code with one bucket as large as the model: every tensor gathered onto the
  sender, converted, then one update call that broadcasts the whole model (what a plain gather + broadcast does).

Each timed push is one full sync (pause, begin, the buckets, version, end, continue), between two barriers of the
trainer's ranks; the group with the engine is built before timing. Reported: median seconds per road, the ratio
bucketed / gather_all, and the largest bucket of full tensors the sender held (the memory bound).

    python benchmarks/bench_weight_sync_layout.py --repeats 5 [--models tiny 25m] [--layouts 1x1 2x1 1x2] [--json]
                                                  [--bucket-mb MB]   (default: below one layer, BUCKET_MB)
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from gyre_hpc.config import EngineConfig, ModelConfig

MODELS = {
    "tiny": ModelConfig(heads=4, kv_heads=2, layers=4),
    "25m": ModelConfig(vocab_size=8192, hidden=512, layers=4, heads=8, kv_heads=4, ffn=1536, max_seq_len=512),
}
#: the bucket per model unless --bucket-mb: below one layer (tiny: ~0.24 MB a layer; 25m: ~12.6 MB a layer)
BUCKET_MB = {"tiny": 0.125, "25m": 8.0}


def _rank(rank: int, world: int, tp: int, pp: int, port: int, urls: dict, models: list, repeats: int,
          bucket_mb: float | None, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    from gyre_hpc.engines.client import EngineClient
    from gyre_hpc.engines.weight_sync import WeightPusher
    from gyre_hpc.train.reshard import push_resharded
    from gyre_hpc.train.stages import init_layout, stage_model

    init_layout(world, rank, tp, pp, port)
    out = {}
    for name in models:
        cfg = MODELS[name]
        bucket_bytes = int((bucket_mb or BUCKET_MB[name]) * 2**20)
        model = stage_model(cfg, seed=1)
        client = EngineClient(urls[name], timeout=600.0) if rank == 0 else None
        pusher = WeightPusher(client, timeout_s=600.0) if rank == 0 else None
        whole = 1 << 40
        push_resharded(model, cfg, pusher, "warm", bucket_bytes)  # group, page faults: not counted
        times = {"bucketed": [], "gather_all": []}
        held, buckets = {}, {}
        for r in range(repeats):
            for road, size in (("bucketed", bucket_bytes), ("gather_all", whole)):
                dist.barrier()
                t0 = time.perf_counter()
                stats = push_resharded(model, cfg, pusher, f"{road}-{r}", size)
                dist.barrier()
                times[road].append(time.perf_counter() - t0)
                held[road] = stats["max_bucket_bytes"]
                buckets[road] = stats.get("buckets")
        if rank == 0:
            out[name] = {"seconds": times, "sender_max_bucket_bytes": held, "buckets": buckets,
                         "bytes": stats.get("bytes")}
            pusher.close()
            client.close()
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def run_layout(tp: int, pp: int, urls: dict, models: list, repeats: int, bucket_mb: float | None) -> dict:
    from gyre_hpc.train.model import _free_port

    world, port = tp * pp, _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, tp, pp, port, urls, models, repeats, bucket_mb, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = queue.get(timeout=1800)
    finally:
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--layouts", nargs="+", default=["1x1", "2x1", "1x2"], help="TPxPP of the trainer")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=None, help="default: BUCKET_MB per model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from gyre_hpc.engines.launch import on_free_port, start_engine

    engine_cfg = EngineConfig(max_running_requests=4, context_len=256, startup_timeout_s=600.0,
                              request_timeout_s=600.0)
    results, handles = [], []
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as tmp:
        try:
            urls = {}
            for name in args.models:
                h = on_free_port(start_engine, engine_cfg, MODELS[name], log_path=Path(tmp) / f"{name}.log",
                                 name=f"bench-{name}")
                handles.append(h)
                urls[name] = h.url
            for layout in args.layouts:
                tp, pp = (int(x) for x in layout.split("x"))
                got = run_layout(tp, pp, urls, args.models, args.repeats, args.bucket_mb)
                for name, r in got.items():
                    med = {k: statistics.median(v) for k, v in r["seconds"].items()}
                    results.append({"layout": layout, "tp": tp, "pp": pp, "model": name, **r, "median_s": med,
                                    "ratio_bucketed_over_gather_all": med["bucketed"] / med["gather_all"]})
        finally:
            for h in handles:
                h.stop()
    head = {"bench": "weight_sync_layout", "date": str(datetime.date.today()), "machine": platform.machine(),
            "torch": torch.__version__, "repeats": args.repeats, "bucket_mb": args.bucket_mb}
    if args.json:
        print(json.dumps({**head, "results": results}))
        return 0
    bucket = args.bucket_mb or BUCKET_MB
    print(f"# bench_weight_sync_layout {head['date']} repeats={args.repeats} bucket MB={bucket}")
    print("| layout TPxPP -> engine TP 1 | model | MB | buckets | bucketed s | gather_all s | ratio | sender peak MB "
          "bucketed / gather_all |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        m, h = r["median_s"], r["sender_max_bucket_bytes"]
        print(f"| {r['layout']} | {r['model']} | {h['gather_all'] / 1e6:.1f} | {r['buckets']['bucketed']} | {m['bucketed']:.4f} | "
              f"{m['gather_all']:.4f} | {r['ratio_bucketed_over_gather_all']:.2f} | {h['bucketed'] / 1e6:.1f} / "
              f"{h['gather_all'] / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
