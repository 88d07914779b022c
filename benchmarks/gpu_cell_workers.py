"""GPU check: a cell's workers on every GPU of the machine, one worker process per GPU, under each layout that fits.

For each layout whose workers fit the devices (TP 1 always; TP 2, DP 2 and DP 2 with the distributed optimizer,
ZeRO-1, from 2 GPUs; TP 4, DP 4 ZeRO-1 and TP 2 x DP 2 from 4; TP 8, TP 4 x DP 2 and DP 8 ZeRO-1 from 8), fresh
spawned workers (``torch.multiprocessing``, NCCL on CUDA, gloo on the CPU; ``init_parallel(world, rank, tp, port)``)
build the same ~100M-parameter megatron GPTModel (``gpu_tree_vs_flat``'s MODEL_100M, sdpa core attention) and
measure, on worker 0's clock between barriers:

- the core step: ``Trainer.group_grads_full`` per group (forward + backward under bf16 autocast, as
  ``gpu_tree_vs_flat`` runs the Trainer; gradients gathered to whole-model CPU tensors), the token-weighted sum,
  ``Trainer.apply_grads`` (one AdamW update on every worker's shards): ``--warmup`` untimed, then the median of
  ``--steps``; and every worker's peak GPU memory over those steps;
- the weight sync: ``Trainer.publish_weights(publisher)`` (bucket by bucket into the transfer buffer,
  ``train.weight_bucket_mb``; the publisher, ``transfer.backend: inprocess``, on worker 0, None elsewhere) against
  the gather-everything road, ``Trainer.export_weights()`` + one ``publisher.publish`` on worker 0, into the same
  publisher, interleaved (A, B, A, B, ...), ``--steps`` times each after one warm-up of each; medians, the ratio
  bucketed / export, and every worker's peak GPU memory over the sync phase.

Every layout's figures also come as ratios against TP 1 (one worker) measured in the same run.

    python benchmarks/gpu_cell_workers.py --out cell_workers.json                    # on the GPU machine (< 4 min)
    python benchmarks/gpu_cell_workers.py --tiny --workers 2 --steps 1 --warmup 1    # checks the script on the CPU
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue as queue_mod
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # gyre_hpc from this tree (the spawned workers re-run this line)
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_tree_vs_flat import MODEL_100M, MODEL_TINY  # noqa: E402

#: name -> (workers, TP, distributed optimizer: ZeRO-1 over the DP replicas), in the order they run
LAYOUTS = {
    "tp1": (1, 1, False),
    "tp2": (2, 2, False), "dp2": (2, 1, False), "dp2-zero1": (2, 1, True),
    "tp4": (4, 4, False), "tp2xdp2": (4, 2, False), "dp4-zero1": (4, 1, True),
    "tp8": (8, 8, False), "tp4xdp2": (8, 4, False), "dp8-zero1": (8, 1, True),
}


def _overrides(args) -> list[str]:
    return (MODEL_TINY if args.tiny else MODEL_100M) + [
        f"model.attention={args.attention}", "trajectory.j_max=null",
        f"trajectory.max_row_tokens={64 * args.path_len}", f"train.micro_batch_tokens={args.micro_batch_tokens}",
        "train.lr=1.0e-5", f"train.weight_bucket_mb={args.bucket_mb}"]


def worker(rank: int, world: int, tp: int, zero1: bool, port: int, args, results) -> None:
    """One worker of one layout: build, time the core steps, time the two sync roads, report to ``results``."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from bench_train_tree_vs_flat import fork_log
    from gyre_hpc.config import TransferConfig, load_config
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer
    from gyre_hpc.trajectory.pipeline import build_batch
    from gyre_hpc.transfer import make_publisher

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)
    try:
        init_parallel(world_size=world, rank=rank, tensor_parallel=tp, master_port=port)
        cfg = load_config(None, _overrides(args))
        trainer = Trainer(cfg.model, dataclasses.replace(cfg.train, distributed_optimizer=zero1), seed=0)
        params = sum(p.numel() for p in trainer.model.parameters())
        groups = []  # the same groups on every worker and layout: equal work
        for g in range(args.groups):
            log, *_ = fork_log(args.fraction, args.path_len, args.paths, cfg.model.vocab_size, seed=g)
            groups.append(build_batch(log, cfg.trajectory, "tree")[0])
        autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda and args.dtype == "bf16"
                    else contextlib.nullcontext)
        sync = torch.cuda.synchronize if cuda else (lambda: None)

        def core_step() -> None:
            acc, z = {}, 0.0
            for b in groups:
                with autocast():
                    _, grads, _ = trainer.group_grads_full(b)
                w = float(b.loss_mask.sum())
                for k, g in grads.items():
                    acc[k] = acc.get(k, 0) + w * g.float().numpy()
                z += w
            trainer.apply_grads({k: v / z for k, v in acc.items()})

        def timed(fn) -> float:
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            dist.barrier()
            return time.perf_counter() - t0

        peak = (lambda: torch.cuda.max_memory_allocated() / 2**30) if cuda else (lambda: None)
        step_s = []
        for i in range(args.warmup + args.steps):
            if cuda and i == args.warmup:
                torch.cuda.reset_peak_memory_stats()
            t = timed(core_step)
            if i >= args.warmup:
                step_s.append(t)
        step_peak = peak()

        publisher = make_publisher(TransferConfig(backend="inprocess")) if rank == 0 else None
        version = [0]

        def bucketed() -> None:
            version[0] += 1
            trainer.set_version(version[0])
            desc = trainer.publish_weights(publisher)
            if rank == 0:
                nbytes["bucketed"] = desc.manifest.total_bytes

        def export() -> None:
            version[0] += 1
            full = trainer.export_weights()  # collective under TP: every rank gathers
            if rank == 0:
                desc = publisher.publish({k: v.numpy() for k, v in full.items()}, version[0])
                nbytes["export"] = desc.manifest.total_bytes

        nbytes: dict[str, int] = {}
        sync_s = {"bucketed": [], "export": []}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for i in range(1 + args.steps):
            for road, fn in (("bucketed", bucketed), ("export", export)) if i % 2 == 0 else (("export", export),
                                                                                           ("bucketed", bucketed)):
                t = timed(fn)
                if i >= 1:
                    sync_s[road].append(t)
        sync_peak = peak()
        held, total = trainer.sharded.held() if trainer.sharded else (1, 1)
        results.put((rank, {"step_s": step_s, "sync_s": sync_s, "bytes": nbytes, "params": params,
                            "peak_gib_step": step_peak, "peak_gib_sync": sync_peak, "moments_held": held / total}))
        if publisher is not None:
            publisher.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - the parent must hear of it rather than wait out its timeout
        results.put((rank, {"error": f"{type(e).__name__}: {e}"}))
        raise


def run_layout(name: str, args) -> dict[int, dict]:
    import torch.multiprocessing as mp

    from gyre_hpc.train.model import _free_port

    world, tp, zero1 = LAYOUTS[name]
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=worker, args=(r, world, tp, zero1, port, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, dict] = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(got) < world:
            try:
                rank, r = results.get(timeout=5)
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: workers exited {dead}" if dead else f"{name}: timed out")
                continue
            if "error" in r:
                raise RuntimeError(f"{name}: worker {rank}: {r['error']}")
            got[rank] = r
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model and batches (CPU check, gloo)")
    ap.add_argument("--workers", type=int, default=None,
                    help="devices to use (default: torch.cuda.device_count(); on the CPU, with --tiny: 1)")
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=None,
                    help="default: every layout whose workers fit --workers")
    ap.add_argument("--attention", choices=["local", "sdpa"], default="sdpa", help="model.attention")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype of the core step")
    ap.add_argument("--groups", type=int, default=2, help="groups per core step")
    ap.add_argument("--paths", type=int, default=32, help="paths per group")
    ap.add_argument("--path-len", type=int, default=512)
    ap.add_argument("--fraction", type=float, default=0.5, help="shared-prefix fraction of a group's paths")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--bucket-mb", type=float, default=64.0, help="train.weight_bucket_mb of publish_weights")
    ap.add_argument("--steps", type=int, default=5, help="timed core steps, and timed syncs per road")
    ap.add_argument("--warmup", type=int, default=2, help="untimed core steps first")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per layout")
    ap.add_argument("--out", help="write the results as JSON here (atomically)")
    args = ap.parse_args()

    import torch

    from gyre_hpc.files.io import atomic_write_json

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("no CUDA device: run with --tiny to check the script on the CPU", file=sys.stderr)
        return 2
    have = torch.cuda.device_count() if cuda else 1
    n = args.workers or have
    if cuda and n > have:
        print(f"--workers {n} > {have} CUDA devices", file=sys.stderr)
        return 2
    if args.tiny:
        args.path_len, args.paths, args.micro_batch_tokens = min(args.path_len, 64), min(args.paths, 8), 256
        args.bucket_mb = min(args.bucket_mb, 0.25)
    layouts = [x for x in (args.layouts or LAYOUTS) if LAYOUTS[x][0] <= n]
    if "tp1" not in layouts:
        layouts.insert(0, "tp1")  # the baseline of every ratio
    device = (f"{n} x {torch.cuda.get_device_name(0)}" if cuda
              else f"CPU ({platform.machine()}, {os.cpu_count()} cores), gloo")
    head = dict(bench="gpu_cell_workers", device=device, torch=torch.__version__, workers=n,
                dtype=args.dtype if cuda else "fp32", attention=args.attention, groups=args.groups,
                paths=args.paths, path_len=args.path_len, fraction=args.fraction,
                micro_batch_tokens=args.micro_batch_tokens, bucket_mb=args.bucket_mb, steps=args.steps,
                warmup=args.warmup, tiny=args.tiny, date=time.strftime("%Y-%m-%d"))
    print("#", json.dumps(head), flush=True)
    rows, base = [], None
    for name in layouts:
        t0 = time.perf_counter()
        got = run_layout(name, args)
        world, tp, zero1 = LAYOUTS[name]
        r0 = got[0]
        med_step = statistics.median(r0["step_s"])
        med_sync = {k: statistics.median(v) for k, v in r0["sync_s"].items()}
        head["params"] = r0["params"]
        row = dict(layout=name, workers=world, tp=tp, dp=world // tp, zero1=zero1, step_s=med_step,
                   step_samples=r0["step_s"], peak_gib_step=[got[r]["peak_gib_step"] for r in range(world)],
                   sync_bucketed_s=med_sync["bucketed"], sync_export_s=med_sync["export"],
                   sync_ratio_bucketed_over_export=med_sync["bucketed"] / med_sync["export"],
                   sync_samples=r0["sync_s"], sync_bytes=r0["bytes"],
                   peak_gib_sync=[got[r]["peak_gib_sync"] for r in range(world)],
                   moments_held_worker0=r0["moments_held"], wall_s=time.perf_counter() - t0)
        if base is None:
            base = row
        row["step_vs_tp1"] = row["step_s"] / base["step_s"]
        row["sync_bucketed_vs_tp1"] = row["sync_bucketed_s"] / base["sync_bucketed_s"]
        if cuda:
            row["peak_step_vs_tp1"] = max(row["peak_gib_step"]) / max(base["peak_gib_step"])
        rows.append(row)
        if len(rows) == 1:
            print("| layout | workers | core step s | vs tp1 | peak GiB/worker (step) | publish_weights s | "
                  "export+publish s | bucketed/export | peak GiB/worker (sync) | worker 0 moments |\n"
                  "|---|---|---|---|---|---|---|---|---|---|")
        gib = lambda xs: " ".join("-" if x is None else f"{x:.1f}" for x in xs)  # noqa: E731
        print(f"| {name} | {world} | {row['step_s']:.4f} | {row['step_vs_tp1']:.2f} | {gib(row['peak_gib_step'])} | "
              f"{row['sync_bucketed_s']:.4f} | {row['sync_export_s']:.4f} | "
              f"{row['sync_ratio_bucketed_over_export']:.2f} | {gib(row['peak_gib_sync'])} | "
              f"{row['moments_held_worker0']:.0%} |", flush=True)
    if args.out:
        atomic_write_json(args.out, {**head, "rows": rows})
        print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
