"""Simulator speed: the three policies on paper_2p4t (target <= 2 s together), events/s, and scaling.

Usage: python benchmarks/bench_sim.py [--repeat 5] [--out FILE]

Times are CPU seconds of this process (``time.process_time``): the machine is shared, so wall time
also counts waiting for a core; both are reported for the paper comparison.

1. paper: ``compare`` of gyre, colocate, async on configs/sim/paper_2p4t.yaml; median wall time of
   ``--repeat`` runs, events and events/s per policy.
2. scaling: gyre alone with 1k, 10k and 100k runs per step (8 runs per query, capacity scaled with the
   load, 4 steps); median seconds per step and per 1k runs, and the ratio to the 1k case (the baseline
   measured in the same run).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

from gyre_hpc.allocator.sim.compare import compare
from gyre_hpc.config import load_config

PAPER = "configs/sim/paper_2p4t.yaml"


def paper(repeat: int) -> tuple[float, float, dict[str, dict[str, float]]]:
    """(median CPU seconds, median wall seconds, last result) of the three-policy comparison."""
    cpu, wall, last = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        last, _ = compare(load_config(PAPER))
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu), statistics.median(wall), last["policies"]


def scaling(runs_per_step: int, repeat: int) -> tuple[float, int]:
    b = runs_per_step // 8
    cap = max(24, int(runs_per_step * 0.75))
    cfg = load_config(PAPER, [f"scheduler.batch_groups={b}", f"scheduler.capacity_runs_per_cell={cap}",
                              f"sim.kv_slots_per_cell={cap}", "sim.steps=4", "sim.policies=[gyre]"])
    times, events = [], 0
    for _ in range(repeat):
        t0 = time.process_time()
        result, _ = compare(cfg)
        times.append(time.process_time() - t0)
        events = result["policies"]["gyre"]["events"]
    return statistics.median(times), events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args()
    lines = [f"# Simulator speed ({time.strftime('%Y-%m-%d')}, 2-core shared CPU, Python "
             f"{platform.python_version()})", "", f"Command: `python benchmarks/bench_sim.py --repeat {args.repeat}`",
             ""]
    cpu, wall, pol = paper(args.repeat)
    lines += [f"paper_2p4t, three policies together (load, workload, simulate, summarize): median **{cpu:.2f} s "
              f"CPU**, {wall:.2f} s wall, over {args.repeat} runs (target <= 2 s; wall time includes waiting for "
              "the CPU on the shared machine)", "", "| policy | events | sim wall seconds (last run) | events/s (wall) |",
              "|---|---|---|---|"]
    for name, r in pol.items():
        lines.append(f"| {name} | {r['events']} | {r['sim_seconds']:.2f} | {r['events_per_s']:,.0f} |")
    lines += ["", "Scaling (gyre, 4 steps, 8 runs per query, capacity scaled with the load):", "",
              "| runs per step | median CPU s | CPU s per 1k runs | events | events per CPU s | time ratio vs 1k |",
              "|---|---|---|---|---|---|"]
    base = None
    for runs in (1_000, 10_000, 100_000):
        reps = args.repeat if runs < 100_000 else max(1, args.repeat // 3)
        sec, events = scaling(runs, reps)
        base = base or sec
        lines.append(f"| {runs:,} | {sec:.2f} | {sec / (4 * runs / 1000):.3f} | {events:,} | {events / sec:,.0f} "
                     f"| {sec / base:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
