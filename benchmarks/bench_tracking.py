"""Overhead of experiment tracking (issue 29): all three backends against tracking off.

  python benchmarks/bench_tracking.py live [--steps 6] [--reps 2]
      A/B live runs of configs/local.yaml (gyre train, mpirun), interleaved off/on; per run the summary's wall_s and
      rank 0's CPU seconds (utime+stime of the rank-0 process, sampled from /proc every 0.2 s until it exits).
  python benchmarks/bench_tracking.py sink [--steps 200]
      the sink alone, in this process: a real metrics.jsonl record fed STEPS times to a Tracker with
      [tensorboard, mlflow, wandb] (local stores); the caller's time per step (what rank 0's loop pays) and the
      process CPU seconds of the worker threads from open to close, against the same loop without a Tracker.
Prints one JSON object; ratios are computed from runs of the same invocation.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL = "tracking.backends=[tensorboard, mlflow, wandb]"
OFF = "tracking.backends=[]"


def _rank0_cpu(stop: threading.Event, out: dict) -> None:
    """Sample the CPU seconds of the rank-0 process (OMPI_COMM_WORLD_RANK=0 of a gyre train rank)."""
    tick = os.sysconf("SC_CLK_TCK")
    pid = None
    while not stop.is_set():
        if pid is None:
            for p in Path("/proc").iterdir():
                if not p.name.isdigit():
                    continue
                try:
                    if b"--run-dir" in (p / "cmdline").read_bytes() and \
                            b"OMPI_COMM_WORLD_RANK=0\0" in (p / "environ").read_bytes():
                        pid = p
                        break
                except OSError:
                    continue
        else:
            try:
                f = (pid / "stat").read_text().rsplit(")", 1)[1].split()
                out["cpu_s"] = (int(f[11]) + int(f[12])) / tick
            except OSError:
                pid = None if "cpu_s" not in out else pid
        time.sleep(0.2)


def live_once(steps: int, tracking: str, out_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(ROOT / "configs" / "local.yaml"), "--json",
           "--set", f"allocator.steps={steps}", "--set", tracking, "--set", f"run.out_dir={out_dir}"]
    stop, cpu = threading.Event(), {}
    t = threading.Thread(target=_rank0_cpu, args=(stop, cpu), daemon=True)
    t.start()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    stop.set()
    t.join()
    if p.returncode != 0:
        raise SystemExit(f"gyre train failed ({p.returncode}):\n{p.stderr[-3000:]}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    return {"wall_s": summary["wall_s"], "rank0_cpu_s": cpu.get("cpu_s")}


def live(args) -> dict:
    runs: dict[str, list] = {"off": [], "all": []}
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        for rep in range(args.reps):
            for side, setting in (("off", OFF), ("all", ALL)) if rep % 2 == 0 else (("all", ALL), ("off", OFF)):
                runs[side].append(live_once(args.steps, setting, Path(tmp)))
                print(side, runs[side][-1], file=sys.stderr, flush=True)
    med = {s: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "rank0_cpu_s")} for s, rs in runs.items()}
    return {"mode": "live", "steps": args.steps, "reps": args.reps, "runs": runs, "median": med,
            "wall_ratio": med["all"]["wall_s"] / med["off"]["wall_s"],
            "rank0_cpu_ratio": med["all"]["rank0_cpu_s"] / med["off"]["rank0_cpu_s"]}


def sink(args) -> dict:
    from gyre_hpc.config import TrackingConfig
    from gyre_hpc.tracking.sink import Tracker

    rec = {"step": 0, "reward": 0.43, "reward_std": 0.2, "staleness_mean": 1.0, "staleness_max": 1,
           "staleness_prequeue_mean": 0.0, "staleness_prequeue_max": 0, "staleness_inqueue_mean": 1.0,
           "staleness_inqueue_max": 1, "trained_tokens": 882, "loss": 0.01, "grad_norm": 0.5, "optimizer_s": 11.5,
           "logprob_abs_diff_mean": 1e-7, "logprob_abs_diff_max": 4e-7, "scored_runs": 64, "runs": 64, "groups": 8,
           "cells": [0, 1]}
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        cfg = TrackingConfig(backends=("tensorboard", "mlflow", "wandb"), close_timeout_s=600)
        tr = Tracker(cfg, Path(tmp), params={f"k{i}": i for i in range(240)}, name="bench")
        caller = []
        for s in range(1, args.steps + 1):
            a = time.perf_counter()
            tr.step({**rec, "step": s}, float(s))
            caller.append(time.perf_counter() - a)
        tr.finish({"wall_s": 1.0}, args.steps)
        tr.close()
        wall = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        errors = tr.take_errors()
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    return {"mode": "sink", "steps": args.steps, "caller_us_per_step_median": statistics.median(caller) * 1e6,
            "caller_us_per_step_max": max(caller) * 1e6, "cpu_s_total": round(cpu, 2),
            "cpu_s_per_step": round(cpu / args.steps, 4), "wall_s_open_to_close": round(wall, 2), "errors": errors}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["live", "sink"])
    p.add_argument("--steps", type=int)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    args.steps = args.steps or (6 if args.mode == "live" else 200)
    print(json.dumps(live(args) if args.mode == "live" else sink(args), indent=1))


if __name__ == "__main__":
    main()
