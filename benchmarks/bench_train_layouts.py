"""A core training step under each layout of a cell's workers, at equal work: TP 1 (one worker), TP 2, DP 2 and
TP 2 x DP 2 over gloo on the CPU, and DP 2 with the distributed optimizer (ZeRO-1: worker 0 then holds about half
of the AdamW moments; the step adds one broadcast per parameter). A correctness-cost figure, not a speed claim: on
two shared cores, more workers cannot be faster; what the table shows is what the collectives (TP gathers in every
layer, the DP all-reduce, the whole-model gradient gather that leaves the cell) cost against one worker.

One step is what ``CoreTrainer`` does with a step's groups: ``group_grads_full`` per group (forward + backward,
gradients gathered to whole-model tensors), the token-weighted sum, ``apply_grads`` (one AdamW update on every
worker's shards). Each layout runs in fresh spawned processes (``torch.multiprocessing``, one per worker, one
thread each); ``--repeats`` timed steps after one warm-up, timed on worker 0; the layouts are interleaved
(repetition r of every layout before r + 1) so background load hits them alike. Reported: the median step seconds
per layout and its ratio against TP 1 measured in the same run.

    python benchmarks/bench_train_layouts.py --repeats 3 --json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # train_batches: hand-built tree rows

#: name -> (workers, TP, distributed optimizer: the AdamW moments sharded over the DP replicas, ZeRO-1)
LAYOUTS = {"tp1": (1, 1, False), "tp2": (2, 2, False), "dp2": (2, 1, False), "tp2xdp2": (4, 2, False),
           "dp2-zero1": (2, 1, True)}
MODEL = dict(vocab_size=512, hidden=256, layers=4, heads=8, kv_heads=4, ffn=1024)
GROUPS = [[(4, 64, [48, 40, 56], 1.0), (2, 80, [32, 64], -0.5)], [(3, 96, [72], 0.7), (2, 50, [20, 30, 40], 0.3)]]


def worker(rank: int, world: int, tp: int, sharded: bool, port: int, steps: int, queue) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from train_batches import fork_pair

    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.model import init_parallel
    from gyre_hpc.train.step import Trainer

    if world > 1:
        init_parallel(world_size=world, rank=rank, tensor_parallel=tp, master_port=port)
    else:
        init_parallel()
    trainer = Trainer(ModelConfig(**MODEL), TrainConfig(lr=1e-3, micro_batch_tokens=256,
                                                        distributed_optimizer=sharded), seed=0)
    batches = [fork_pair(g, seed=i)[0] for i, g in enumerate(GROUPS)]
    times = []
    for _ in range(1 + steps):
        t0 = time.perf_counter()
        acc, z = {}, 0.0
        for b in batches:
            _, grads, _ = trainer.group_grads_full(b)
            w = float(b.loss_mask.sum())
            for k, g in grads.items():
                acc[k] = acc.get(k, 0) + w * g.numpy()
            z += w
        trainer.apply_grads({k: v / z for k, v in acc.items()})
        times.append(time.perf_counter() - t0)
    if rank == 0:  # with the share of the moments' elements worker 0 holds
        held, total = trainer.sharded.held() if trainer.sharded else (1, 1)
        queue.put((times[1:], held / total))
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def run_layout(name: str, steps: int) -> tuple[list[float], float]:
    import torch.multiprocessing as mp

    from gyre_hpc.train.model import _free_port

    world, tp, sharded = LAYOUTS[name]
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=worker, args=(r, world, tp, sharded, port, steps, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = queue.get(timeout=1800)
    for p in procs:
        p.join(timeout=120)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of every layout")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per repetition (after one warm-up)")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seen: dict[str, list[float]] = {n: [] for n in args.layouts}
    moments: dict[str, float] = {}
    for r in range(args.repeats):
        for name in args.layouts:
            times, moments[name] = run_layout(name, args.steps)
            seen[name] += times
            print(f"repeat {r + 1}/{args.repeats} {name}: median {statistics.median(seen[name]):.3f} s",
                  file=sys.stderr, flush=True)
    med = {n: statistics.median(t) for n, t in seen.items()}
    base = med.get("tp1")
    rows = [{"layout": n, "workers": LAYOUTS[n][0], "tp": LAYOUTS[n][1], "step_s": round(m, 4),
             "moments_held": round(moments[n], 3),
             "vs_tp1": round(m / base, 3) if base else None, "samples": len(seen[n])} for n, m in med.items()]
    out = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}", "model": MODEL,
           "repeats": args.repeats, "steps": args.steps, "rows": rows}
    if args.json:
        print(json.dumps(out))
    else:
        for row in rows:
            print(f"{row['layout']:>9}  {row['workers']} worker(s)  {row['step_s']:.3f} s/step  x{row['vs_tp1']}  "
                  f"worker 0 holds {row['moments_held']:.0%} of the AdamW moments")


if __name__ == "__main__":
    main()
