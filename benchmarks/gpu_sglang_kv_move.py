"""GPU check: does SGLang 0.5.23 carry a moved run's KV to another server through HiCache + a Mooncake store?

What gyre's Mover would do with SGLang engines (docs/engines.md, "SGLang's own ways to carry KV"): the source
server writes its KV pages through to a shared Mooncake store (``--hicache-write-policy write_through``); after a
run is cut there (abort: partial output back), the proxy resubmits prompt + partial output to the target
unchanged, and the target's HiCache finds the prefix's pages in the store (L3) and loads them instead of
recomputing them. No new call: ``prepare`` stays empty; what changes is how the servers are launched.

This script measures that on ONE GPU with two servers sharing it (each ``--mem-fraction-static``), one
``mooncake_master`` on loopback (TCP by default: no RDMA NIC needed; ``--protocol rdma`` on a machine with one):

    per prompt length L, --reps times, ABBA:
      A  /generate P (L random tokens) + --partial new tokens          the source's run, cut after them
      wait --settle-s                                                  write-through to host, then to the store
      B  /generate P + partial, max_new_tokens 1    "move"             TTFT; meta_info.cached_tokens(_details)
      B  /generate Q + partial-length (fresh), max_new_tokens 1  "re-prefill"   TTFT of the same length, no hit
      A and B  /generate P + partial, --check-tokens greedy tokens     do both continue alike?

    python benchmarks/gpu_sglang_kv_move.py --out results.json                  # tiny random Qwen3, ~3-6 min
    python benchmarks/gpu_sglang_kv_move.py --model /models/Qwen3-0.6B --lengths 4096 16384 --out r.json
    python benchmarks/gpu_sglang_kv_move.py --dry-run                           # print the commands (any machine)

Needs: a CUDA GPU; SGLang 0.5.23 with its CUDA kernels (``sglang-kernel``: HiCache's host<->device copies are
its kernels, and its host pool is pinned memory: neither exists on a CPU); ``mooncake-transfer-engine`` (the
CUDA package: the store client and the ``mooncake_master`` binary); gyre_hpc on PYTHONPATH only for the default
model (``gyre_hpc.models.init``). Not run yet: no GPU machine with SGLang was lent while this was written (the
lent H200 image has no SGLang, no registry, and a working tree travels with 64 MiB at most; shared/notes/gpu-h200.md).
Every process it starts is stopped by its process group at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(f"[gpu-kv-move {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_model(out: Path) -> Path:
    """A random Qwen3 big enough that prefill costs something (hidden 1024, 16 layers, 32K context)."""
    sys.path.insert(0, str(ROOT))
    from gyre_hpc.models.init import init_model

    return init_model("qwen3", out, hidden=1024, layers=16, heads=16, kv_heads=8, vocab=1024, context=32768)


def commands(args, model: str, ports: dict) -> dict[str, list[str]]:
    store = {"master_server_address": f"127.0.0.1:{ports['master']}", "local_hostname": "127.0.0.1",
             "metadata_server": f"http://127.0.0.1:{ports['metadata']}/metadata", "protocol": args.protocol,
             "device_name": "", "global_segment_size": args.segment, "local_buffer_size": "1gb"}
    server = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
              "--skip-tokenizer-init", "--mem-fraction-static", str(args.mem_fraction),
              "--context-length", str(max(args.lengths) + args.partial + args.check_tokens + 64),
              "--page-size", str(args.page_size), "--enable-hierarchical-cache",
              "--hicache-write-policy", "write_through", "--hicache-storage-backend", "mooncake",
              "--hicache-storage-prefetch-policy", "wait_complete",
              "--hicache-storage-backend-extra-config", json.dumps(store), "--enable-cache-report"]
    return {
        "master": [args.master_bin, f"--rpc_port={ports['master']}", "--enable_http_metadata_server=true",
                   f"--http_metadata_server_port={ports['metadata']}", "--eviction_high_watermark_ratio=0.95"],
        "A": server + ["--port", str(ports["A"])],
        "B": server + ["--port", str(ports["B"])],
    }


def start(cmd: list[str], log_path: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def wait_ready(http, url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited {proc.returncode}; log {log_path}:\n{log_path.read_text()[-3000:]}")
        try:
            if http.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(2)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s; log {log_path}")


def generate(http, url: str, ids: list[int], new: int) -> tuple[dict, float]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}}
    t0 = time.perf_counter()
    r = http.post(f"{url}/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json(), time.perf_counter() - t0


def measure(args, http, urls: dict, vocab: int) -> list[dict]:
    rng = random.Random(args.seed)
    rows = []
    for length in args.lengths:
        for rep in range(args.reps):
            p = [rng.randrange(vocab) for _ in range(length)]
            src, src_s = generate(http, urls["A"], p, args.partial)
            partial = src["output_ids"]
            time.sleep(args.settle_s)
            q = [rng.randrange(vocab) for _ in range(length + len(partial))]
            order = ("move", "reprefill") if rep % 2 == 0 else ("reprefill", "move")
            got = {}
            for kind in order:
                ids = p + partial if kind == "move" else q
                out, sec = generate(http, urls["B"], ids, 1)
                meta = out["meta_info"]
                got[kind] = {"ttft_s": sec, "cached_tokens": meta.get("cached_tokens"),
                             "details": meta.get("cached_tokens_details")}
            cont_a, _ = generate(http, urls["A"], p + partial, args.check_tokens)
            cont_b, _ = generate(http, urls["B"], p + partial, args.check_tokens)
            same = sum(a == b for a, b in zip(cont_a["output_ids"], cont_b["output_ids"]))
            row = {"length": length, "rep": rep, "source_s": src_s, "tokens": length + len(partial), **{
                f"{k}_{f}": v for k, d in got.items() for f, v in d.items()},
                "continuation_equal": f"{same}/{args.check_tokens}"}
            log(json.dumps(row))
            rows.append(row)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for length in sorted({r["length"] for r in rows}):
        rs = [r for r in rows if r["length"] == length]
        move = statistics.median(r["move_ttft_s"] for r in rs)
        base = statistics.median(r["reprefill_ttft_s"] for r in rs)
        storage = [((r["move_details"] or {}).get("storage") or 0) / r["tokens"] for r in rs]
        out.append({"length": length, "move_ttft_s": round(move, 4), "reprefill_ttft_s": round(base, 4),
                    "speedup": round(base / move, 2) if move else None,
                    "storage_hit_fraction": round(statistics.median(storage), 3),
                    "continuations": [r["continuation_equal"] for r in rs]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="an HF model directory (default: a random Qwen3 written by gyre_hpc)")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384], help="prompt tokens")
    p.add_argument("--partial", type=int, default=32, help="tokens the source generates before the cut")
    p.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared after the move")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--settle-s", type=float, default=2.0, help="wait for the write-through to reach the store")
    p.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"])
    p.add_argument("--segment", default="8gb", help="memory each server gives the store (global_segment_size)")
    p.add_argument("--mem-fraction", type=float, default=0.3, help="--mem-fraction-static per server")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--master-bin", default=shutil.which("mooncake_master") or "mooncake_master")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("gpu_sglang_kv_move.json"))
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-kv-move-"))
    ports = {k: free_port() for k in ("master", "metadata", "A", "B")}
    if args.dry_run:
        for name, cmd in commands(args, args.model or "MODEL_DIR", ports).items():
            print(f"{name}: {' '.join(cmd)}")
        return 0
    import httpx
    import torch

    if not torch.cuda.is_available():
        log("no CUDA device: HiCache needs one (pinned host pool, sglang-kernel copies); nothing measured")
        return 2
    model = args.model or str(default_model(work / "model"))
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    env = {**os.environ, "MC_LOG_LEVEL": "ERROR"}
    cmds = commands(args, model, ports)
    procs: list[subprocess.Popen] = []
    result = {"device": torch.cuda.get_device_name(0), "model": model, "protocol": args.protocol,
              "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        procs.append(start(cmds["master"], work / "master.log", env))
        time.sleep(2)
        if procs[0].poll() is not None:
            raise RuntimeError(f"mooncake_master exited: {(work / 'master.log').read_text()[-2000:]}")
        urls = {}
        with httpx.Client() as http:
            for name in ("A", "B"):  # one at a time: two cold starts on one GPU contend for its memory
                procs.append(start(cmds[name], work / f"server{name}.log", env))
                urls[name] = f"http://127.0.0.1:{ports[name]}"
                wait_ready(http, urls[name], procs[-1], work / f"server{name}.log", args.startup_timeout_s)
                log(f"server {name} ready at {urls[name]}")
            rows = measure(args, http, urls, vocab)
        result.update(rows=rows, summary=summarise(rows))
        print(json.dumps(result["summary"], indent=1))
        return 0
    except Exception as exc:  # the outcome is recorded either way
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(result["error"])
        return 1
    finally:
        stop(procs[::-1])
        result["logs"] = str(work)
        args.out.write_text(json.dumps(result, indent=1))
        log(f"wrote {args.out}; logs in {work}")


if __name__ == "__main__":
    sys.exit(main())
