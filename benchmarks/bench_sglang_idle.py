"""CPU an idle SGLang server burns on the CPU, with and without ``--sleep-on-idle`` (``engine.sglang_sleep_on_idle``),
and what the sleep costs the first request after a pause.

Each repeat starts one real SGLang server on the CPU per setting (the tiny qwen3 model ``gyre model init`` writes,
as tests/integration/test_engine_conformance.py does), alternating spin / sleep, and for each:

1. sends one short request (the server is warm), waits ``--settle`` seconds, then counts the CPU seconds of the
   server's whole process tree (launcher, scheduler, detokenizer; /proc through psutil) over ``--idle`` seconds;
2. sends ``--calls`` short requests, each after 1 s of idleness, and records each one's latency (a sleeping
   scheduler is woken by the request's arrival on its socket, so the latency should not grow).

Reported per setting: the median over repeats of the idle CPU share (CPU s / idle s) and of the median latency;
the ratio sleep / spin. The server is stopped before the next starts (one at a time: two would share the cores).

    python benchmarks/bench_sglang_idle.py --repeats 2 [--idle 10] [--json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine
from gyre_hpc.models.init import init_model

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
SETTINGS = {"spin": False, "sleep": True}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and all its descendants now alive."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(model: Path, sleep: bool, args, tmp: Path) -> dict:
    cfg = EngineConfig(kind="sglang", model_path=str(model), device="cpu", max_running_requests=8, context_len=512,
                       startup_timeout_s=900.0, request_timeout_s=300.0, sglang_sleep_on_idle=sleep)
    handle = on_free_port(start_engine, cfg, ModelConfig(), log_path=tmp / f"sglang-{sleep}.log", name="bench")
    try:
        client = handle.client(timeout=300.0)
        params = {"max_new_tokens": 4, "ignore_eos": True}
        client.generate(PROMPT, params)
        time.sleep(args.settle)
        c0, t0 = tree_cpu_s(handle.pid), time.monotonic()
        time.sleep(args.idle)
        share = (tree_cpu_s(handle.pid) - c0) / (time.monotonic() - t0)
        latencies = []
        for _ in range(args.calls):
            time.sleep(1.0)
            t = time.perf_counter()
            client.generate(PROMPT, params)
            latencies.append(time.perf_counter() - t)
        client.close()
        return {"idle_cpu_share": round(share, 4), "latency_s": round(statistics.median(latencies), 4),
                "latencies_s": [round(x, 4) for x in latencies]}
    finally:
        handle.stop(grace_s=30.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="servers started per setting (alternating)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idleness whose CPU is counted")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the warm-up request before counting")
    ap.add_argument("--calls", type=int, default=5, help="requests after 1 s of idleness each, for the latency")
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="bench-sglang-idle-") as d:
        tmp = Path(d)
        model = init_model("qwen3", tmp / "qwen3-tiny", head_dim=16, ffn=128)
        for r in range(args.repeats):
            for name, sleep in SETTINGS.items():
                got = measure(model, sleep, args, tmp)
                runs[name].append(got)
                if not args.json:
                    print(f"repeat {r + 1}/{args.repeats} {name}: {got}", file=sys.stderr, flush=True)
    med = {name: {"idle_cpu_share": statistics.median(x["idle_cpu_share"] for x in rs),
                  "latency_s": statistics.median(x["latency_s"] for x in rs)} for name, rs in runs.items()}
    out = {"benchmark": "sglang_idle", "date": datetime.date.today().isoformat(), "machine": platform.node(),
           "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "idle_s": args.idle,
           "repeats": args.repeats, "runs": runs, "median": med,
           "ratio_sleep_over_spin": {k: (round(med["sleep"][k] / med["spin"][k], 4) if med["spin"][k] else None)
                                     for k in ("idle_cpu_share", "latency_s")}}
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
