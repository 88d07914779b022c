"""``gyre sweep CONFIG --grid KEY=A,B ...``: one job per grid element (a SLURM job array), results tabulated.

::

    parse and check the grid; load every element's config   (gyre_hpc.sweep: bad input fails here, nothing submitted)
    OUT = runs/sweep-TIMESTAMP (or --out)
    submit: --simulate  each element one simulator run       (gyre_hpc.slurm.submit_tasks.simulate_element)
            otherwise   each element one live training run   (train_rank on SLURM, train_local locally)
    wait with a progress line (done / running / failed)      (gyre_hpc.slurm.submit_sweep)
    OUT/results.csv, results.md, plot.png; exit 1 if any element failed
    tracking.backends: one tracked run per element, grouped (gyre_hpc.tracking.sweep)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gyre_hpc.errors import ConfigError
from gyre_hpc.models import run_init
from gyre_hpc.rundir import RunDir
from gyre_hpc.sweep import (counts, expand, load_elements, markdown_table, metric_columns, parse_grid, result_rows,
                            write_results)
from gyre_hpc.slurm.layout import preflight
from jobs import add_overrides

DESCRIPTION = """\
Run a grid of configs as one SLURM job array (submitit; the local executor without SLURM), each element a live
training run or, with --simulate, a simulator run; collect results.csv, results.md and plot.png. Failed
elements are listed with their error, and the exit status is 1 if any failed.

  gyre sweep configs/sim/small.yaml --simulate --grid scheduler.staleness_target=1,1.5 --grid cluster.cells=4,8
  gyre sweep configs/local_4node.yaml --grid trajectory.j_max=1,3,5,null --grid scheduler.staleness_target=1,1.5
  gyre sweep configs/local.yaml --executor local --grid scheduler.policy=gyre,colocate --set allocator.steps=4

Values are split on commas outside brackets (agent.turns=[1, 2],[1, 3]); null is None. Every element's config is
checked before anything is submitted. docs/submitit.md.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config, e.g. configs/local_4node.yaml or configs/sim/small.yaml")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=A,B,C",
                   help="a grid axis (repeatable); the sweep runs every combination")
    add_overrides(p, "allocator.steps=4", "; applied to every element before its grid values")
    p.add_argument("--simulate", action="store_true", help="each element is a simulator run (gyre simulate)")
    p.add_argument("--executor", choices=["auto", "slurm", "local"], default="auto",
                   help="auto: SLURM when srun is on PATH, else submitit's local executor")
    p.add_argument("--out", metavar="DIR", help="output directory (default runs/sweep-TIMESTAMP); must not exist")
    p.add_argument("--parallel", type=int, metavar="N",
                   help="elements running at once (default: all with --simulate, 1 for training)")
    p.add_argument("--timeout-min", type=int, metavar="MIN",
                   help="time limit of each element (default: slurm.time of the config)")


def run(args: argparse.Namespace) -> int:
    from gyre_hpc.allocator.sim.compare import validate_all
    from gyre_hpc.slurm.submit import executor_kind

    axes = parse_grid(args.grid)
    elements = expand(axes)
    cfgs = load_elements(args.config, args.overrides, elements, validate_all if args.simulate else preflight)
    kind = executor_kind(args.executor)
    out = Path(args.out or f"runs/sweep-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: exists and is not empty; give a new directory")
    parallel = args.parallel or (len(elements) if args.simulate else 1)
    what = "simulator runs" if args.simulate else "training runs"
    print(f"sweep: {len(elements)} {what} on {kind} -> {out}", flush=True)
    tasks, metrics = _tasks(args, cfgs, elements, kind, out)
    from gyre_hpc.slurm.submit_sweep import run_tasks

    outcomes = run_tasks(tasks, kind, out / "submitit", parallel, metrics)
    rows = result_rows(elements, outcomes)
    title = f"gyre sweep {args.config} ({what}, {kind})"
    csv_path, md_path = write_results(rows, out, title)
    from gyre_hpc.report.sweep_plots import sweep_plot

    plot = sweep_plot(rows, [a.key for a in axes], metric_columns(rows, args.simulate), out / "plot.png", title)
    from gyre_hpc.tracking.sweep import track_sweep

    for err in track_sweep(cfgs[0].tracking, out, [a.key for a in axes], rows):  # one grouped run per element
        print(f"sweep: tracking: {err['backend']}: {err['error']}", file=sys.stderr)
    n = counts(outcomes)
    print(markdown_table(rows), end="")
    print(f"{n['completed']} completed, {n['failed']} failed; wrote {csv_path}, {md_path}, {plot}")
    return 0 if n["failed"] == 0 else 1


def _tasks(args, cfgs, elements, kind, out: Path):
    from gyre_hpc.slurm import jobspec
    from gyre_hpc.slurm.submit_sweep import SweepJob, train_metrics
    from gyre_hpc.slurm.submit_tasks import simulate_element, train_local, train_rank

    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for e, cfg in zip(elements, cfgs):
        if args.simulate:
            params = jobspec.single_task_parameters(cfg, args.timeout_min)
            config = str(Path(args.config).resolve())
            tasks.append(SweepJob(e.index, simulate_element, (config, list(args.overrides) + e.overrides), params))
            continue
        run_dir = out / f"e{e.index:03d}"
        run_dir, cfg = run_init.new_run(cfg, "gyre sweep", path=run_dir)  # resolved, as gyre train writes it
        config = RunDir(run_dir).config_path
        if kind == "slurm":
            params = jobspec.train_parameters(cfg, out / "submitit")
            fn = train_rank
        else:
            params, fn = jobspec.single_task_parameters(cfg), train_local
        if args.timeout_min:
            params["timeout_min"] = args.timeout_min
        tasks.append(SweepJob(e.index, fn, (str(config), str(run_dir)), params))
    return tasks, (lambda row: row) if args.simulate else train_metrics
