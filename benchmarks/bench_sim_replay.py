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
    results, failed = [], []
    for d in dirs:
        try:
            results.append(replay(d))
        except subprocess.CalledProcessError as exc:  # e.g. a run interrupted before its first step
            failed.append(f"{d.name}: {(exc.stderr or '').strip().splitlines()[-1:] or exc.returncode}")
    print("| policy | run | measured wall s | predicted wall s | error | measured span s | predicted span s "
          "| span error | what-if spans s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(row(r))
    errs = [abs(r["sim_span_error_pct"]) for r in results]
    print(f"\nmedian |span error| {statistics.median(errs):.1f}% over {len(errs)} runs")
    print("\n" + "\n".join(distribution(results)))
    for f in failed:
        print(f"not replayed: {f}")
    return 0


def _q(xs: list[float], q: float) -> float:
    """The q-quantile of ``xs`` by linear interpolation (numpy's default), without numpy."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def distribution(results: list[dict]) -> list[str]:
    """Markdown table of the wall and span errors' distribution: per policy and over all runs (issue 13)."""
    lines = ["| runs | n | wall error median (signed) | abs wall error median / p90 / max | "
             "span error median (signed) | abs span error median / p90 / max |", "|---|---|---|---|---|---|"]
    groups = {"all": results, **{p: [r for r in results if r["policy"] == p]
                                 for p in sorted({r["policy"] for r in results})}}
    for name, rs in groups.items():
        if not rs:
            continue
        w = [r["sim_error_pct"] for r in rs]
        s = [r["sim_span_error_pct"] for r in rs]
        aw, as_ = [abs(x) for x in w], [abs(x) for x in s]
        lines.append(f"| {name} | {len(rs)} | {statistics.median(w):+.1f}% | {statistics.median(aw):.1f} / "
                     f"{_q(aw, 0.9):.1f} / {max(aw):.1f}% | {statistics.median(s):+.1f}% | "
                     f"{statistics.median(as_):.1f} / {_q(as_, 0.9):.1f} / {max(as_):.1f}% |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
