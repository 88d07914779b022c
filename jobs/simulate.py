"""``gyre simulate``: predict wall time, idle fractions and staleness of scheduling policies."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gyre_hpc.allocator.sim.compare import compare, validate_all
from gyre_hpc.allocator.sim.sweep import parse_axes, run_grid, write_tables
from gyre_hpc.config import GyreConfig, load_config
from gyre_hpc.errors import ConfigError
from jobs import add_overrides

DESCRIPTION = """\
Simulate the configured policies (sim.policies) on one workload in virtual time and compare them:
wall hours for sim.steps optimizer steps, speedups, training/rollout idle fractions, staleness, and the
query-duration distribution. The model and every parameter are explained in docs/simulator.md.

Examples:
  gyre simulate configs/sim/paper_2p4t.yaml
  gyre simulate configs/sim/paper_2p4t.yaml --json
  gyre simulate configs/sim/paper_2p4t.yaml --plot runs/plots
  gyre simulate configs/sim/paper_2p4t.yaml --set workload.stuck_query_frac=0 --set cluster.cells=8
  gyre simulate configs/sim/small.yaml --sweep cluster.cells=2,4,8 --sweep scheduler.theta=0.25,0.5 --out runs/sw
  gyre simulate configs/sim/small.yaml --seeds 10 --perturb 0.2     (a band over seeds and inputs; sensitivity)

Replay a live run (gyre train's run directory): its measured run durations, training and switch times and the
same scheduler config go into the simulator; it prints the predicted wall time beside the measured one, and
what gyre, colocate and async would have taken on the same runs (docs/simulator.md, "Replaying a live run"):
  gyre simulate --trace runs/local-20261129-112235
  gyre simulate --trace runs/local-20261129-112235 --json --plot runs/replay
  gyre simulate --trace RUN_DIR --set sim.to_train_s=0.5     (what if switches were faster)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (e.g. configs/sim/paper_2p4t.yaml); not with --trace")
    p.add_argument("--trace", metavar="RUN_DIR", help="replay a gyre train run directory instead of a config")
    add_overrides(p, "scheduler.theta=0.25")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots (role timelines, query durations, staleness)")
    p.add_argument("--track", action="store_true",
                   help="with --trace: log the replay's numbers and its predicted-vs-measured plot (--plot DIR, "
                        "default RUN_DIR/replay) to the run's trackers (its tracking.backends, same runs)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=A,B,C",
                   help="run a grid over these values (repeatable); writes sweep.csv and sweep.md")
    p.add_argument("--out", metavar="DIR", help="sweep output directory (default runs/sim-sweep-<time>)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="also report each policy's hours as a band over N workload seeds, and which input "
                        "moves the result most (docs/simulator.md, 'Uncertainty')")
    p.add_argument("--perturb", type=float, default=0.0, metavar="FRAC",
                   help="with --seeds: also draw each workload/cell input from value x U(1-FRAC, 1+FRAC); "
                        "FRAC (default 0.2) is also the sensitivity step")


def _table(result: dict) -> str:
    pol = result["policies"]
    lines = [f"{'policy':<20} {'hours':>8} {'gyre x':>7} {'train idle':>10} {'roll idle':>9} "
             f"{'E[d] tok':>8} {'E[d] run':>8} {'p50':>4} {'p99':>4} {'max':>4}"]
    for name, r in pol.items():
        speed = pol["gyre"]["hours"] and r["hours"] / pol["gyre"]["hours"] if "gyre" in pol else float("nan")
        lines.append(f"{name:<20} {r['hours']:>8.2f} {speed:>7.2f} {r['train_idle_frac']:>10.1%} "
                     f"{r['rollout_idle_frac']:>9.1%} {r['staleness_mean']:>8.2f} {r['staleness_sample_mean']:>8.2f} "
                     f"{r['staleness_p50']:>4.0f} {r['staleness_p99']:>4.0f} {r['staleness_max']:>4.0f}")
    w = result["workload"]
    lines.append(f"\nworkload (durations under {w['source_policy']}): {w['frac_queries_ge_4h']:.1%} of queries "
                 f">= 4 h, {w['frac_queries_hit_timeout']:.1%} hit the {w['timeout_h']:g} h timeout, "
                 f"{w['frac_queries_within_5pct_of_timeout']:.1%} within 5% of it; mean query "
                 f"{w['query_hours_mean']:.2f} h; per run {w['tokens_per_run_mean']:,.0f} rollout tokens, "
                 f"{w['trained_tokens_per_run_mean']:,.0f} trained (J_max)")
    if "band" in result:
        lines += _band_lines(result)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.trace is None):
        raise ConfigError("give a CONFIG or --trace RUN_DIR (exactly one of them); see gyre simulate --help")
    if args.trace:
        return _replay(args)
    if args.sweep:
        axes = parse_axes(args.sweep)
        rows = run_grid(args.config, args.overrides, axes, compare, validate_all)
        out = Path(args.out or f"runs/sim-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
        csv_path, md_path = write_tables(rows, out)
        print(json.dumps(rows) if args.json else md_path.read_text(), end="" if not args.json else "\n")
        if not args.json:
            print(f"wrote {csv_path} and {md_path}")
        return 0
    cfg = load_config(args.config, args.overrides)
    if args.seeds < 1 or not 0 <= args.perturb < 1:
        raise ConfigError(f"--seeds must be >= 1 and --perturb in [0, 1), got {args.seeds} and {args.perturb}")
    result, sims = compare(cfg)
    if args.seeds != 1 or args.perturb != 0:
        _uncertainty(args, cfg, result)
    if args.plot:
        from gyre_hpc.report.sim_plots import write_all  # matplotlib only when plotting

        paths = write_all(sims, cfg.workload.timeout_h * 3600.0, Path(args.plot))
        if not args.json:
            print("plots: " + ", ".join(str(p) for p in paths))
    print(json.dumps(result, indent=None if args.json else 2) if args.json else _table(result))
    return 0


def _uncertainty(args: argparse.Namespace, cfg: GyreConfig, result: dict) -> None:
    from gyre_hpc.allocator.sim.uncertainty import band, sensitivity

    result["band"] = band(cfg, args.seeds, args.perturb)
    result["sensitivity"] = sensitivity(cfg, args.perturb or 0.2)


def _band_lines(result: dict) -> list[str]:
    b = result["band"]
    what = f"{b['seeds']} seeds" + (f", inputs perturbed +-{b['perturb']:.0%}" if b["perturb"] else "")
    lines = [f"\nband over {what}: hours median [p10, p90] (min..max); gyre x likewise"]
    for name, e in b["policies"].items():
        h, g = e["hours"], e.get("vs_gyre")
        ratio = f"; gyre x {g['median']:.2f} [{g['p10']:.2f}, {g['p90']:.2f}]" if g else ""
        lines.append(f"  {name:<20} {h['median']:.2f} [{h['p10']:.2f}, {h['p90']:.2f}] "
                     f"({h['min']:.2f}..{h['max']:.2f}){ratio}")
    if result["sensitivity"]:
        top = result["sensitivity"][0]
        moved = ", ".join(f"{n} {min(x):+.1f}%..{max(x):+.1f}%" for n, x in top["hours_change_pct"].items())
        rest = ", ".join(f"{r['input']} {r['max_abs_pct']:.1f}%" for r in result["sensitivity"][1:4])
        lines.append(f"most sensitive to {top['input']} (x{1 - top['frac']:g}..x{1 + top['frac']:g}: {moved}); "
                     f"next: {rest}")
    return lines


def _replay(args: argparse.Namespace) -> int:
    from gyre_hpc.allocator.sim.replay import replay

    result, sims = replay(args.trace, overrides=args.overrides)
    if getattr(args, "track", False) and not args.plot:
        args.plot = str(Path(args.trace) / "replay")
    pngs = []
    if args.plot:
        from gyre_hpc.allocator.eventlog import read_events
        from gyre_hpc.report.replay_plots import measured_vs_predicted  # matplotlib only when plotting

        run_dir = Path(result["run_dir"])
        path = measured_vs_predicted(read_events(run_dir / "events.jsonl"), sims[result["policy"]],
                                     result["policy"], Path(args.plot) / "replay_roles.png")
        pngs.append(Path(path))
        if not args.json:
            print(f"plot: {path}")
    if getattr(args, "track", False):
        from gyre_hpc.tracking.live import log_replay

        for err in log_replay(Path(args.trace), result, pngs):
            print(f"gyre simulate: tracking: {err['backend']}: {err['error']}", file=sys.stderr)
    print(json.dumps(result) if args.json else _replay_table(result))
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _replay_table(r: dict) -> str:
    m, c = r["measured"], r["calibration"]
    wall = "-" if m["wall_s"] is None else f"{m['wall_s']:.1f}"
    lines = [f"replay of {r['run_dir']} ({r['policy']}, {r['cells']} cells, {r['steps']} steps, "
             f"B={r['batch_groups']})",
             f"measured on the run: {c['groups']} groups ({c['censored_groups']} cut at the stop), {c['runs']} runs "
             f"({c['timed_out_runs']} timed out); training {c['train_tok_s_per_cell']:,.0f} tok/s per cell, "
             f"optimizer step {c['optimizer_s']:.2f} s; switch to train {c['to_train_s']:.2f} s, to rollout "
             f"{c['to_rollout_s']:.2f} s, satellite pull {c['pull_s']:.2f} s",
             "",
             f"{'':<28} {'wall s':>8} {'error':>7} {'span s':>8} {'error':>7} {'train idle':>10} {'switches':>8} "
             f"{'E[d]':>5}",
             f"{'measured (' + r['policy'] + ')':<28} {wall:>8} {'':>7} {m['span_s']:>8.1f}"]
    for name, p in r["predicted"].items():
        label = f"simulated {name}" + (" (what-if)" if name != r["policy"] else "")
        w = "-" if p["wall_s"] is None else f"{p['wall_s']:.1f}"
        err = _pct(p["error_pct"]) if name == r["policy"] else ""
        span_err = _pct(p["span_error_pct"]) if name == r["policy"] else ""
        lines.append(f"{label:<28} {w:>8} {err:>7} {p['span_s']:>8.1f} {span_err:>7} "
                     f"{p['train_idle_frac']:>10.1%} {p['switches']:>8d} {p['staleness_mean']:>5.2f}")
    if c["from_config"]:
        lines.append(f"note: the run made no switch to measure {', '.join(c['from_config'])}: the config's value")
    if c["lost_cells"]:
        lines.append(f"note: cells {c['lost_cells']} were lost in the run; the simulation keeps every cell")
    for name, why in r["skipped"].items():
        lines.append(f"simulated {name}: skipped ({why})")
    lines.append("\nspan = first admission to the last optimizer step; wall = span + the run's measured start-up "
                 "and teardown")
    return "\n".join(lines)
