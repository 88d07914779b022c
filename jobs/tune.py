"""``gyre tune CONFIG|--trace RUN_DIR [--budget N] --out OVERLAY.yaml``: the simulator chooses the knobs.

::

    cfg, workload  = CONFIG and its workload          (or a live run's directory, calibrated as gyre simulate --trace)
    tuning         = coordinate descent over theta, tau_s, mu, async_train_cells   (gyre_hpc.allocator.sim.tune)
    OVERLAY.yaml   = {scheduler: chosen knobs}, with the predicted hours in its header
    load it with   gyre simulate CONFIG --overlay OVERLAY.yaml   (or gyre train / sweep / submit ... --overlay)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from gyre_hpc.allocator.sim.tune import tune, workload_for
from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.files.io import atomic_write_text
from jobs import add_overrides

DESCRIPTION = """\
Search the scheduling knobs (scheduler.theta, tau_s, mu and the async cell split async_train_cells) in the
simulator for one workload and write the chosen values as a YAML overlay. Every policy of sim.policies is
tuned by the same procedure and objective (the geometric mean of their simulated hours), each policy's E[d]
held at or below 1.1 x scheduler.staleness_target. docs/simulator.md, "Tuning".

  gyre tune configs/sim/small.yaml --out runs/small-tuned.yaml
  gyre tune configs/sim/paper_2p4t.yaml --budget 40 --out runs/paper-tuned.yaml
  gyre tune --trace runs/local-20261129-112235 --out runs/local-tuned.yaml
  gyre simulate configs/sim/small.yaml --overlay runs/small-tuned.yaml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (e.g. configs/sim/small.yaml); not with --trace")
    p.add_argument("--trace", metavar="RUN_DIR", help="tune for a live run's directory (its calibrated workload)")
    p.add_argument("--budget", type=int, default=24, metavar="N", help="at most N simulated points (default 24)")
    p.add_argument("--out", required=True, metavar="OVERLAY.yaml", help="where to write the overlay")
    p.add_argument("--json", action="store_true", help="print the search record as JSON")
    add_overrides(p, "sim.steps=12")


def _inputs(args: argparse.Namespace):
    if (args.config is None) == (args.trace is None):
        raise ConfigError("give a CONFIG or --trace RUN_DIR (exactly one of them); see gyre tune --help")
    if args.config:
        cfg = load_config(args.config, args.overrides)
        wl = workload_for(cfg)
        return cfg, wl, args.config
    from gyre_hpc.allocator.sim.compare import queries_needed
    from gyre_hpc.allocator.sim.replay import WHAT_IF, _valid, calibrate, read_run, replay_config

    run = read_run(args.trace)
    cal = calibrate(run)
    cfg = replay_config(run, cal, WHAT_IF, args.overrides)
    names = [p for p in WHAT_IF if _valid(p, cfg) is None]  # the policies the run's cells allow
    cfg = replay_config(run, cal, names, args.overrides)
    return cfg, cal.workload.take(queries_needed(cfg)), args.trace


def run(args: argparse.Namespace) -> int:
    cfg, wl, source = _inputs(args)
    finite = wl.work_s[np.isfinite(wl.work_s)]
    query_s = float(np.median(finite)) if finite.size else cfg.workload.timeout_h * 3600.0
    result = tune(cfg, wl, args.budget, query_s, progress=None if args.json else print)
    header = (f"# gyre tune {source} (budget {args.budget}, {len(result.evaluated)} points simulated)\n"
              f"# policies {', '.join(cfg.sim.policies)}; staleness target {cfg.scheduler.staleness_target}\n"
              f"# predicted hours: {json.dumps({k: round(v, 3) for k, v in result.best_hours.items()})}\n"
              f"# geometric mean {result.best_score:.3f} h (the config's own knobs: {result.start_score:.3f} h)\n")
    path = atomic_write_text(Path(args.out), header + yaml.safe_dump(result.overlay(), sort_keys=False))
    if args.json:
        print(json.dumps({"overlay": result.overlay(), "start": result.start, "hours": result.best_hours,
                          "score_hours": result.best_score, "start_score_hours": result.start_score,
                          "evaluated": result.evaluated, "out": str(path)}))
    else:
        print(f"chose {result.best} (was {result.start}): {result.best_score:.3f} h vs {result.start_score:.3f} h; "
              f"wrote {path}")
    return 0
