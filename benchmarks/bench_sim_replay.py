"""Benchmark: how close the simulator's replay of a live run comes to the run's measured wall time, per policy.

For each policy (``--policies``, default colocate gyre async) it runs ``gyre train configs/local.yaml`` with
``--steps`` optimizer steps (``--repeats`` times), then replays each run directory with the simulator
(``gyre simulate --trace RUN_DIR --json``: the live policy plus the what-ifs on the same runs) and prints a
markdown table: measured wall and span, predicted wall and span, errors, and the what-if spans.
``--run-dirs`` replays existing run directories instead of starting runs.

    python benchmarks/bench_sim_replay.py --steps 4                      # 3 live runs (minutes each)
    python benchmarks/bench_sim_replay.py --run-dirs runs/local-*        # replay what is there
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def live_run(policy: str, steps: int, out: Path, extra: list[str]) -> Path:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sets = [f"scheduler.policy={policy}", f"allocator.steps={steps}", f"run.out_dir={out}",
            f"run.name=replay-{policy}", "proxy.startup_timeout_s=180", *extra]
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(ROOT / "configs" / "local.yaml"), "--json"]
    proc = subprocess.run(cmd + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"gyre train ({policy}) failed:\n{proc.stderr[-3000:]}")
    return Path(json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"])


def replay(run_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "gyre_hpc.cli", "simulate", "--trace", str(run_dir), "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(proc.stdout)


def row(r: dict) -> str:
    m, p = r["measured"], r["predicted"][r["policy"]]
    others = ", ".join(f"{n} {q['span_s']:.1f}" for n, q in r["predicted"].items() if n != r["policy"])
    return (f"| {r['policy']} | {Path(r['run_dir']).name} | {m['wall_s']:.1f} | {r['sim_wall_s']:.1f} | "
            f"{r['sim_error_pct']:+.1f}% | {m['span_s']:.1f} | {r['sim_span_s']:.1f} | "
            f"{r['sim_span_error_pct']:+.1f}% | {others} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", nargs="+", default=["colocate", "gyre", "async"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default="runs/bench-replay")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more gyre train overrides")
    ap.add_argument("--run-dirs", nargs="*", help="replay these run directories instead of starting runs")
    args = ap.parse_args()
    dirs = [Path(d) for d in args.run_dirs] if args.run_dirs else [
        live_run(p, args.steps, Path(args.out), args.extra) for _ in range(args.repeats) for p in args.policies]
    results = [replay(d) for d in dirs]
    print("| policy | run | measured wall s | predicted wall s | error | measured span s | predicted span s "
          "| span error | what-if spans s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(row(r))
    errs = [abs(r["sim_span_error_pct"]) for r in results]
    print(f"\nmedian |span error| {statistics.median(errs):.1f}% over {len(errs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
