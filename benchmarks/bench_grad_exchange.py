"""Gradient exchange, satellite → core: today's pickled MPI message vs gradients as tensors (a registered buffer the
core pulls, only the descriptor on the data plane; gyre_hpc/transfer/gradients.py).

The script runs itself under ``mpirun -n 2`` with the environment ``gyre train`` gives its ranks on one host (Open
MPI over shared memory, vader, as root). Rank 1 is the satellite, rank 0 the core; both run on the data-plane
communicator (``dataplane.open_data_comm``) and the core receives with ``dataplane.wait`` (polling with back-off), as the live runtime does.
Per model size, float32 gradients with the shapes of a megatron GPT (embedding, per layer QKV / projection /
SwiGLU fc1 / fc2 / norms, final norm, output layer) are exchanged ``--repeats`` times per road, the roads
interleaved (repeat r of every road before repeat r + 1) so background load hits them alike; one warm-up exchange
per road is not counted. One exchange is timed at the core from a barrier to holding every array:

- ``pickle``: the satellite sends ``{version, gid, z, grads: {name: ndarray}, ...}`` (today: pickled by mpi4py);
- ``socket`` / ``mooncake``: the satellite writes the gradients into its buffer segment (one copy, chunk
  checksums), sends the header with the descriptor; the core pulls (chunked reads, header check, checksum
  verification). ``inprocess`` is not a road between two processes.

Reported: the median exchange seconds and GB/s (gradient bytes / seconds) per road and size, and each buffer
road's ratio against ``pickle``; the core's arrays are checked equal to the satellite's once per road and size.

    python benchmarks/bench_grad_exchange.py --sizes tiny 25m 100m --repeats 5 --json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORKER = "GYRE_BENCH_GRAD_WORKER"
#: (vocab, hidden, layers, ffn): the embedded default, then about 25 M and 100 M parameters
SIZES = {"tiny": (256, 64, 2, 256), "25m": (8192, 512, 5, 1536), "100m": (32000, 768, 7, 2048)}
ROADS = ("pickle", "socket", "mooncake")


def gpt_shapes(vocab: int, hidden: int, layers: int, ffn: int) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a megatron GPT with SwiGLU and untied embeddings (the default ``ModelConfig`` layout)."""
    shapes = {"embedding.word_embeddings.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"decoder.layers.{i}."
        shapes.update({p + "self_attention.linear_qkv.layer_norm_weight": (hidden,),
                       p + "self_attention.linear_qkv.weight": (3 * hidden, hidden),
                       p + "self_attention.linear_proj.weight": (hidden, hidden),
                       p + "mlp.linear_fc1.layer_norm_weight": (hidden,),
                       p + "mlp.linear_fc1.weight": (2 * ffn, hidden),
                       p + "mlp.linear_fc2.weight": (hidden, ffn)})
    shapes.update({"decoder.final_layernorm.weight": (hidden,), "output_layer.weight": (vocab, hidden)})
    return shapes


def gradients(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from gyre_hpc.live import dataplane as dp
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer.gradients import GradientReceiver, GradientSender

    comm = dp.open_data_comm()
    rank = comm.Get_rank()
    roads = [r for r in ROADS if r in args.roads]
    cfgs = {r: TransferConfig(backend=r, timeout_s=60) for r in roads if r != "pickle"}
    results: dict = {}
    for size in args.sizes:
        shapes = gpt_shapes(*SIZES[size])
        grads = gradients(shapes, seed=1) if rank == 1 else None
        nbytes = sum(int(np.prod(s)) * 4 for s in shapes.values())
        ends = {r: (GradientSender(cfgs[r], shapes, slots=1) if rank == 1 else GradientReceiver(cfgs[r]))
                for r in cfgs}
        times: dict[str, list[float]] = {r: [] for r in roads}
        for rep in range(args.repeats + 1):  # repeat 0 warms up (handshakes, page faults) and checks the bytes
            for road in roads:
                comm.Barrier()
                t0 = time.perf_counter()
                if rank == 1:
                    header = {"version": rep, "gid": 0, "z": 1.0, "loss": 0.0, "lag": {}, "seconds": 0.0,
                              "group": None, "extra": {}}
                    if road == "pickle":
                        comm.send({**header, "grads": grads}, dest=0, tag=dp.GRADS)
                    else:
                        comm.send({**header, "grads": ends[road].publish(grads, rep, 0).to_dict()},
                                  dest=0, tag=dp.GRADS)
                else:
                    msg = dp.wait(comm, dp.GRADS, 1, timeout_s=600)  # polls with back-off, as the cells do
                    arrays = msg["grads"] if road == "pickle" else ends[road].pull(msg["grads"])[0]
                    seconds = time.perf_counter() - t0
                    if rep == 0:
                        expected = gradients(shapes, seed=1)
                        assert all(np.array_equal(arrays[k], expected[k]) for k in expected), road
                        del expected
                    else:
                        times[road].append(seconds)
                    del arrays, msg
                comm.Barrier()  # the satellite keeps its segment until the core holds the arrays
        for end in ends.values():
            end.close()
        if rank == 0:
            results[size] = {"params": nbytes // 4, "bytes": nbytes,
                             "roads": {r: {"seconds": times[r], "median_s": statistics.median(times[r]),
                                           "gb_per_s": nbytes / statistics.median(times[r]) / 1e9} for r in roads}}
            for r in roads:
                if r != "pickle" and "pickle" in roads:
                    results[size]["roads"][r]["ratio_vs_pickle"] = (results[size]["roads"]["pickle"]["median_s"] /
                                                                    results[size]["roads"][r]["median_s"])
        del grads
    if rank == 0:
        print(json.dumps({"results": results}), flush=True)
    MPI.COMM_WORLD.Barrier()


def launch(args: argparse.Namespace) -> dict:
    from gyre_hpc.slurm.sbatch import LOCAL_EXPORTS, SINGLE_HOST_EXPORTS

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found (apt-get install openmpi-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env.update(dict(e.split("=", 1) for e in LOCAL_EXPORTS + SINGLE_HOST_EXPORTS))
    env.update({WORKER: "1", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)})
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-n", "2", sys.executable, str(Path(__file__).resolve()),
           "--sizes", *args.sizes, "--roads", *args.roads, "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if out.returncode != 0:
        sys.exit(f"mpirun failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith('{"results"')][-1])["results"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--roads", nargs="+", choices=ROADS, default=list(ROADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    args = ap.parse_args()
    if os.environ.get(WORKER):
        return worker(args)
    results = launch(args)
    record = {"benchmark": "grad_exchange", "date": datetime.date.today().isoformat(), "host": platform.node(),
              "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0], "repeats": args.repeats, "results": results}
    if args.json:
        print(json.dumps(record))
        return
    print(f"{'size':>6} {'params':>12} {'road':>9} {'median s':>10} {'GB/s':>8} {'vs pickle':>10}")
    for size, res in results.items():
        for road, r in res["roads"].items():
            ratio = f"{r['ratio_vs_pickle']:.2f}x" if "ratio_vs_pickle" in r else "-"
            print(f"{size:>6} {res['params']:>12,} {road:>9} {r['median_s']:>10.4f} {r['gb_per_s']:>8.2f} {ratio:>10}")


if __name__ == "__main__":
    main()
