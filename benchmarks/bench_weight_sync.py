"""Weight sync into a running engine, by road: distributed (the hot path), tensor and disk, against memcpy and a
loopback socket.

For each model (the tiny default, and a ~100M-parameter one of the same family: hidden 768, 10 layers, vocab 8192)
one local engine is started on its seed's weights, and the same new weights (another seed, HF names) reach it by:

- ``distributed``: ``WeightPusher.push`` (pause in place, begin, ``/update_weights_from_distributed`` + gloo
  broadcast over loopback, ``/update_weight_version``, end, continue); the group is built once, before timing;
- ``disk``: ``save_weights`` (torch.save of megatron tensors + checksum, what the core used to write for engines)
  then ``/update_weights_from_disk`` (read, checksum, load); both parts are reported;
- ``tensor``: ``TensorPusher.push`` (pause in place, begin, ``/update_weights_from_tensor`` with SGLang's
  serialization: the storages moved into shared-memory files, their names in the request; the engine maps and
  loads them; ``/update_weight_version``, end, continue); fresh tensors each time, as a pull gives the cell;

Baselines measured in the same run over the same bytes: ``memcpy`` (torch ``copy_`` into preallocated tensors,
one thread) and ``socket`` (sendall/recv_into over a loopback TCP connection between two threads). Repeats are
interleaved (repeat r of every road before r+1). GB/s counts the tensor bytes once.

    python benchmarks/bench_weight_sync.py --repeats 5 [--models tiny 100m] [--json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.engines.weight_sync import WeightPusher, engine_tensors
from gyre_hpc.engines.weight_tensor import TensorPusher
from gyre_hpc.engines.weights import save_weights, weights_checksum
from gyre_hpc.train.model import build_model

MODELS = {
    "tiny": ModelConfig(),
    "100m": ModelConfig(vocab_size=8192, hidden=768, layers=10, heads=12, ffn=3072, max_seq_len=512),
}


def state_of(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in build_model(cfg, seed=seed).state_dict().items()
            if isinstance(v, torch.Tensor)}


def nbytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _fresh(state) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


def memcpy_s(state) -> float:
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    t0 = time.perf_counter()
    for k, v in state.items():
        dst[k].copy_(v)
    return time.perf_counter() - t0


def socket_s(state) -> float:
    """Seconds to move every tensor's bytes over one loopback TCP connection (receiver in a thread)."""
    total = nbytes(state)
    srv = socket.create_server(("127.0.0.1", 0))
    got = bytearray(total)
    done = threading.Event()

    def receive():
        conn, _ = srv.accept()
        view, pos = memoryview(got), 0
        while pos < total:
            pos += conn.recv_into(view[pos:], min(total - pos, 4 << 20))
        conn.close()
        done.set()

    th = threading.Thread(target=receive)
    th.start()
    cli = socket.create_connection(srv.getsockname())
    t0 = time.perf_counter()
    for v in state.values():
        cli.sendall(v.contiguous().view(-1).view(torch.uint8).numpy())
    done.wait()
    seconds = time.perf_counter() - t0
    cli.close()
    th.join()
    srv.close()
    return seconds


def measure(name: str, cfg: ModelConfig, repeats: int, tmp: Path) -> dict:
    engine_cfg = EngineConfig(max_running_requests=4, context_len=256, startup_timeout_s=600.0,
                              request_timeout_s=600.0)
    new = state_of(cfg, seed=1)
    send = engine_tensors(new, cfg)
    size = nbytes(new)
    handle = on_free_port(start_engine, engine_cfg, cfg, log_path=tmp / f"engine-{name}.log", name="bench")
    client = handle.client(timeout=600.0)
    pusher = WeightPusher(client, timeout_s=600.0)
    tensor_pusher = TensorPusher(client, retries=0)
    times: dict[str, list[float]] = {k: [] for k in ("distributed", "tensor", "disk", "disk_write", "disk_load",
                                                     "memcpy", "socket")}
    try:
        pusher.connect()
        pusher.push(send, "warmup")  # warm-up: page faults on both sides, not counted
        tensor_pusher.push(_fresh(send), "warmup-t")
        for r in range(repeats):
            t0 = time.perf_counter()
            pusher.push(send, f"d{r}")
            times["distributed"].append(time.perf_counter() - t0)
            fresh = _fresh(send)  # a pull hands the cell new tensors each version: their storages are not shared yet
            t0 = time.perf_counter()
            tensor_pusher.push(fresh, f"t{r}")
            times["tensor"].append(time.perf_counter() - t0)
            del fresh
            t0 = time.perf_counter()
            path = save_weights(tmp / f"{name}-v{r}", new, f"k{r}")
            t1 = time.perf_counter()
            client.update_weights_from_disk(str(path), f"k{r}")
            t2 = time.perf_counter()
            times["disk_write"].append(t1 - t0)
            times["disk_load"].append(t2 - t1)
            times["disk"].append(t2 - t0)
            times["memcpy"].append(memcpy_s(new))
            times["socket"].append(socket_s(new))
        assert client.weights_checksum() == weights_checksum(new)  # the last sync (disk) loaded exactly these
        pusher.push(send, "check")
        assert client.weights_checksum() == weights_checksum(new)  # and so does the road (HF names mapped back)
        client.update_weights_from_disk(str(save_weights(tmp / f"{name}-old", state_of(cfg, seed=0), "old")), "old")
        tensor_pusher.push(_fresh(send), "check-t")
        assert client.weights_checksum() == weights_checksum(new)  # and the tensor road
    finally:
        pusher.close()
        client.close()
        handle.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    params = sum(t.numel() for t in new.values())
    return {"model": name, "params": params, "bytes": size, "repeats": repeats, "seconds": times,
            "median_s": med, "gb_per_s": {k: size / v / 1e9 for k, v in med.items()}}


def table(results: list[dict]) -> list[str]:
    rows = ["| model | params | MB | road | median s | GB/s | vs memcpy | vs socket |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        m, g = r["median_s"], r["gb_per_s"]
        for road in ("distributed", "tensor", "disk", "disk_write", "disk_load", "memcpy", "socket"):
            rows.append(f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['bytes'] / 1e6:.1f} | {road} | "
                        f"{m[road]:.4f} | {g[road]:.3f} | {m['memcpy'] / m[road]:.3f} | {m['socket'] / m[road]:.3f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=5, help="timed syncs per road and model (>= 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        results = [measure(m, MODELS[m], args.repeats, Path(tmp)) for m in args.models]
    head = {"bench": "weight_sync", "date": str(datetime.date.today()), "machine": platform.machine(),
            "python": sys.version.split()[0], "torch": torch.__version__}
    if args.json:
        print(json.dumps({**head, "results": results}))
    else:
        print(f"# bench_weight_sync  {head['date']}  {head['machine']} python {head['python']}  "
              f"repeats={args.repeats}")
        print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
