"""Why gyre's lead over async is small on live_genbound, and where it grows: a simulator-only study (issue 13).

Usage: python benchmarks/sim_gyre_advantage.py [--trace RUN_DIR] [--overlay TUNED.yaml] [--target 1]
           [--steps 12] [--seeds 0 1 2] [--set KEY=VALUE] [--budget 24] [--knobs tuned|overlay] [--md FILE] [--png FILE] [--json]

SimWorkload: the live gyre run ``--trace`` (default: the quiet sweep's gyre-t1 run of configs/bench/live_genbound.yaml)
replayed the way ``gyre simulate --trace`` does (``sim/replay.py``: durations de-loaded into nominal work, the
emulated device's curve, ``load_model: calls``), every policy at the same ``scheduler.staleness_target``.

Part 1, the breakdown (base point, seed 0, the overlay's knobs): per policy the span, per-step time, and where
the cell-time goes (rolling out, training busy, training idle, switching), the mean number of generating cells,
runs per generating engine, the speed of a run relative to an unloaded engine (``capacity.speed_factor``,
time-weighted over runs), and the nominal generation work done per second. Measured by wrapping the rollout pool's
clock (``RolloutPool.advance``) in this script: instrumentation only, the simulator is unchanged.

Part 2, the sweep, one knob at a time around the base point:
- ``train_x``: training cost per token x1 / x4 / x10 / x25 (``sim.train_tok_s_per_cell`` divided): the ratio of
  training time per step to generation time per step;
- ``tail_k``: the spread of run durations in log space scaled by k = 0.5 / 1 / 1.5 / 2 around the median, then
  rescaled to keep the mean nominal work (tokens per run kept, so training per step does not move);
- ``cells``: 4 / 8 / 16 cells with ``batch_groups`` = cells (the same runs per cell).
Seeds: seed 0 is the trace's query order, seed s > 0 a seeded permutation of its queries. Knobs: ``tuned`` runs
``gyre tune``'s search (``sim/tune.py``, the same coordinate descent for every policy, from the overlay's point,
``--budget`` simulations, feasibility E[d] <= 1.1 x target) once per point on seed 0 and uses its choice for all
seeds; ``overlay`` uses the overlay for every point. A ratio is comparable when the two policies' measured E[d]
(mean over seeds) are within 10% (``staleness.comparable``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre_hpc.allocator.policies import make_policy  # noqa: E402
from gyre_hpc.allocator.sim.compare import queries_needed  # noqa: E402
from gyre_hpc.allocator.sim.metrics import role_times, summarize  # noqa: E402
from gyre_hpc.allocator.sim.replay import calibrate, read_run, replay_config  # noqa: E402
from gyre_hpc.allocator.sim.simulator import Simulation  # noqa: E402
from gyre_hpc.allocator.sim.tune import SPACE, tune  # noqa: E402
from gyre_hpc.allocator.sim.workload import SimWorkload  # noqa: E402
from gyre_hpc.allocator.staleness import comparable  # noqa: E402
from gyre_hpc.config import overlay_overrides  # noqa: E402
from gyre_hpc.files.io import atomic_write_text  # noqa: E402

POLICIES = ("gyre", "colocate", "async")
TRACE = "tests/unit/data/live_genbound_load/gyre-t1"
OVERLAY = "benchmarks/results/tuned/live_genbound-tuned-v2.yaml"
KNOBS = {"train_x": [1, 4, 10, 25, 50, 100], "tail_k": [0.5, 1.0, 1.5, 2.0, 2.5], "cells": [2, 4, 8, 16]}
BASE = {"train_x": 1, "tail_k": 1.0, "cells": 4}
MARKER = "<!-- generated below by benchmarks/sim_gyre_advantage.py -->"


# ---------------------------------------------------------------- workload transforms
def permute(wl: SimWorkload, seed: int) -> SimWorkload:
    """The same queries in a seeded order (seed 0: unchanged)."""
    if seed == 0:
        return wl
    order = np.random.default_rng(seed).permutation(wl.queries)
    idx = np.concatenate([np.arange(wl.offsets[q], wl.offsets[q + 1]) for q in order])
    sizes = np.diff(wl.offsets)[order]
    return SimWorkload(wl.work_s[idx], wl.tok_per_work_s[idx], wl.train_window_s[idx],
                    np.concatenate([[0], np.cumsum(sizes)]), wl.tool_frac)


def tail(wl: SimWorkload, k: float) -> SimWorkload:
    """Run durations with their log-spread around the median scaled by ``k``, rescaled to the same mean; the
    tokens of each run kept (so training per step is unchanged); runs that never finish stay so."""
    w = wl.work_s
    fin = np.isfinite(w)
    logs = np.log(w[fin])
    med = np.median(logs)
    new = np.exp(med + k * (logs - med))
    new *= w[fin].mean() / new.mean()
    work = w.copy()
    work[fin] = new
    rate = wl.tok_per_work_s.copy()
    rate[fin] = rate[fin] * w[fin] / new
    return SimWorkload(work, rate, wl.train_window_s, wl.offsets, wl.tool_frac)


# ---------------------------------------------------------------- one simulation, instrumented
def simulate(cfg, name: str, wl: SimWorkload) -> dict:
    """``compare.simulate_policy`` plus the rollout pool's load and speed integrals (instrumentation)."""
    policy = make_policy(name, cfg.scheduler, cfg.cluster.cells)
    sim = Simulation(policy, cfg.sim, cfg.scheduler, wl, cfg.cluster.cells, cfg.workload.timeout_h * 3600.0)
    pool, acc = sim.pool, {"active": 0.0, "load": 0.0, "load2": 0.0, "load_rate": 0.0, "rate": 0.0}
    inner = pool.advance

    def advance(c: int, now: float) -> None:
        dt = now - pool.t[c]
        if dt > 0 and pool.active[c]:
            acc["active"] += dt
            acc["load"] += dt * pool.load[c]
            acc["load2"] += dt * pool.load[c] ** 2
            acc["load_rate"] += dt * pool.load[c] * pool.rate[c]
            acc["rate"] += dt * pool.rate[c]
        inner(c, now)

    pool.advance = advance
    end = sim.run()
    r = summarize(sim, end, 1.0)
    roles = role_times(sim, end)
    steps = cfg.sim.steps
    train_t = roles.get("train", 0.0)
    trained = [q for q in range(wl.queries) if not math.isnan(sim.q_end[q]) and q not in sim.g_trained
               and q != sim.cur]
    group_max = [float(wl.work_s[wl.offsets[q]:wl.offsets[q + 1]].max()) for q in trained]
    r.update({
        "span_s": end, "step_s": end / steps,
        "rollout_cells": roles.get("rollout", 0.0) / end,
        "train_busy_cells": min(sim.train_busy, train_t) / end,
        "train_idle_cells": max(0.0, train_t - sim.train_busy) / end,
        "switch_cells": (roles.get("draining", 0.0) + roles.get("loading", 0.0)) / end,
        "runs_per_engine": acc["load"] / acc["active"] if acc["active"] else 0.0,
        "run_speed": acc["load_rate"] / acc["load"] if acc["load"] else 0.0,
        "gen_work_per_s": acc["load_rate"] / end,
        "train_s_per_step": sim.train_busy / steps,
        "runs_in_flight": acc["load"] / end,
        "load_cv": math.sqrt(max(0.0, acc["load2"] * acc["active"] / acc["load"] ** 2 - 1.0)) if acc["load"] else 0.0,
        "gen_work_per_step": acc["load_rate"] / steps,
        "trained_groups": len(trained),
        "trained_group_max_work_s": float(np.mean(group_max)) if group_max else 0.0,
        "trained_group_latency_s": float(np.mean([sim.q_end[q] - sim.q_start[q] for q in trained])) if trained else 0.0,
    })
    return r


# ---------------------------------------------------------------- one point of the sweep
class Point:
    def __init__(self, trace: str, overlay: list[str], target: float, steps: int, point: dict):
        run = read_run(ROOT / trace if not Path(trace).is_absolute() else trace)
        cal = calibrate(run)
        sets = [*overlay, f"scheduler.staleness_target={target}", f"sim.steps={steps}",
                f"sim.train_tok_s_per_cell={cal.sim['train_tok_s_per_cell'] / point['train_x']}",
                f"cluster.cells={point['cells']}", f"scheduler.batch_groups={point['cells']}"]
        self.cfg = replay_config(run, cal, POLICIES, sets)
        self.base_wl = tail(cal.workload, point["tail_k"])
        self.point = point

    def workload(self, seed: int) -> SimWorkload:
        return permute(self.base_wl, seed).take(queries_needed(self.cfg))

    def tuned(self, budget: int) -> tuple[object, dict]:
        t = tune(self.cfg, self.workload(0), budget=budget, query_s=30.0)
        sets = [f"scheduler.{k}={v}" for k, v in t.best.items()]
        from gyre_hpc.config import GyreConfig, apply_overrides, build, to_dict
        return build(GyreConfig, apply_overrides(to_dict(self.cfg), sets)), {k: t.best[k] for k in SPACE}


def decompose(g: dict, o: dict) -> dict:
    """span(o) / span(gyre) = work per step ratio x runs-in-flight ratio x run-speed ratio (exact: span = steps x
    generation work per step / (runs in flight x run speed))."""
    return {"work_per_step": o["gen_work_per_step"] / g["gen_work_per_step"],
            "in_flight": g["runs_in_flight"] / o["runs_in_flight"], "speed": g["run_speed"] / o["run_speed"]}


def run_point(p: Point, seeds: list[int], budget: int, knobs: str) -> dict:
    if knobs == "tuned":
        cfg, chosen = p.tuned(budget)
    else:
        cfg, chosen = p.cfg, {k: getattr(p.cfg.scheduler, k) for k in SPACE}
    per = {name: [simulate(cfg, name, p.workload(s)) for s in seeds] for name in POLICIES}
    out = {"point": p.point, "knobs": chosen, "policies": {}}
    for name, rs in per.items():
        out["policies"][name] = {k: float(np.mean([r[k] for r in rs])) for k in
                                 ("span_s", "staleness_mean", "frac_queries_hit_timeout", "train_s_per_step",
                                  "rollout_cells", "runs_per_engine", "run_speed", "runs_in_flight",
                                  "gen_work_per_step", "gen_work_per_s", "train_idle_cells", "switch_cells",
                                  "load_cv")}
        out["policies"][name]["span_s_per_seed"] = [r["span_s"] for r in rs]
    g = out["policies"]["gyre"]
    out["ratios"] = {}
    for other in ("async", "colocate"):
        o = out["policies"][other]
        out["ratios"][other] = {"ratio": o["span_s"] / g["span_s"],
                                "per_seed": [b / a for a, b in zip(g["span_s_per_seed"], o["span_s_per_seed"])],
                                "comparable": comparable(g["staleness_mean"], o["staleness_mean"])}
    w = p.base_wl.work_s[np.isfinite(p.base_wl.work_s)]
    out["run_work_s"] = {"p50": float(np.percentile(w, 50)), "p90": float(np.percentile(w, 90)), "max": float(w.max()),
                         "mean": float(w.mean())}
    out["decomposition"] = {o: decompose(g, out["policies"][o]) for o in ("async", "colocate")}
    out["gen_cells_ratio"] = g["rollout_cells"] / out["policies"]["async"]["rollout_cells"]
    a = out["policies"]["async"]
    out["train_share"] = a["train_s_per_step"] / (a["span_s"] / p.cfg.sim.steps)
    return out


# ---------------------------------------------------------------- what-ifs at the base point (diagnostics)
def with_sets(cfg, sets: list[str]):
    from gyre_hpc.config import GyreConfig, apply_overrides, build, to_dict

    return build(GyreConfig, apply_overrides(to_dict(cfg), sets))


def what_ifs(trace: str, overlay: list[str], target: float, steps: int, seed: int = 0) -> list[dict]:
    """(1) async with one more cell that only trains: as many generating cells as the pool, training for free --
    how much of gyre's lead is async's idle training cell; (2) runs re-spread over the engines after every event
    (the live proxy routes each call to the least-loaded engine; the simulator moves runs only when a cell returns
    to rollout, which async never does): how much the simulator's sticky placement favours gyre. Diagnostics
    only: (2) patches ``Simulation._flush`` inside this function and restores it."""
    rows = []
    for cells in (4, 8, 16):
        p = Point(trace, overlay, target, steps, {**BASE, "cells": cells})
        wl = p.workload(seed)
        base = {n: simulate(p.cfg, n, wl) for n in POLICIES}
        free = simulate(with_sets(p.cfg, [f"cluster.cells={cells + 1}", "scheduler.async_train_cells=1"]), "async",
                        permute(p.base_wl, seed).take(queries_needed(p.cfg)))
        inner = Simulation._flush

        def flush(self, now, _inner=inner):
            self.pool.rebalance(now, self.state.version)
            _inner(self, now)

        Simulation._flush = flush
        try:
            spread = {n: simulate(p.cfg, n, wl) for n in POLICIES}
        finally:
            Simulation._flush = inner
        rows.append({"cells": cells, "async_train_cells": p.cfg.scheduler.async_train_cells,
                     "sticky": {n: (r["span_s"], r["staleness_mean"]) for n, r in base.items()},
                     "async_free_trainer": (free["span_s"], free["staleness_mean"]),
                     "respread": {n: (r["span_s"], r["staleness_mean"]) for n, r in spread.items()}})
    return rows


def what_if_table(rows: list[dict]) -> list[str]:
    lines = ["| cells | gyre s (E[d]) | async s (E[d]) | async + a free training cell s (E[d]) | gyre x async | "
             "gyre x async-with-free-trainer | re-spread every event: gyre / async / colocate s | "
             "re-spread: gyre x async / x colocate (sticky: x colocate) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, a, f, sp = r["sticky"]["gyre"], r["sticky"]["async"], r["async_free_trainer"], r["respread"]
        lines.append(f"| {r['cells']} | {g[0]:.1f} ({g[1]:.2f}) | {a[0]:.1f} ({a[1]:.2f}) | {f[0]:.1f} ({f[1]:.2f}) | "
                     f"{a[0] / g[0]:.2f} | {f[0] / g[0]:.2f} | {sp['gyre'][0]:.1f} / {sp['async'][0]:.1f} / "
                     f"{sp['colocate'][0]:.1f} | {sp['async'][0] / sp['gyre'][0]:.2f} / "
                     f"{sp['colocate'][0] / sp['gyre'][0]:.2f} ({r['sticky']['colocate'][0] / g[0]:.2f}) |")
    return lines


# ---------------------------------------------------------------- report
BREAK_KEYS = [("span_s", "span s", "{:.1f}"), ("step_s", "s / step", "{:.2f}"), ("staleness_mean", "E[d]", "{:.2f}"),
              ("rollout_cells", "generating cells", "{:.2f}"), ("train_busy_cells", "training busy", "{:.3f}"),
              ("train_idle_cells", "training idle", "{:.2f}"), ("switch_cells", "switching", "{:.3f}"),
              ("runs_per_engine", "runs / generating engine", "{:.1f}"), ("run_speed", "run speed (x unloaded)",
                                                                          "{:.3f}"),
              ("gen_work_per_s", "generation work / s", "{:.2f}"), ("runs_in_flight", "runs in flight", "{:.1f}"),
              ("gen_work_per_step", "generation work / step", "{:.1f}"),
              ("load_cv", "runs per engine: coefficient of variation (over engines and time)", "{:.2f}"),
              ("trained_group_max_work_s", "trained groups: longest run's work s", "{:.2f}"),
              ("trained_group_latency_s", "trained groups: admission to ready s", "{:.2f}"), ("train_s_per_step", "training s / step", "{:.3f}"),
              ("frac_queries_hit_timeout", "queries cut", "{:.0%}")]


def breakdown_table(b: dict) -> list[str]:
    lines = ["| | " + " | ".join(POLICIES) + " |", "|---|" + "---|" * len(POLICIES)]
    for key, label, fmt in BREAK_KEYS:
        lines.append(f"| {label} | " + " | ".join(fmt.format(b[p][key]) for p in POLICIES) + " |")
    return lines


def sweep_table(rows: list[dict], knob: str) -> list[str]:
    lines = [f"| {knob} | knobs (theta, tau_s, mu, async_train_cells) | run work p50 / p90 / max s | "
             "async: training s / its step | generating cells gyre / async | "
             "gyre s (E[d]) | async s (E[d]) | colocate s (E[d]) | gyre x async | gyre x colocate | "
             "x async = work/step x in-flight x speed | load CV gyre / async |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        P = r["policies"]
        cells = [f"{P[p]['span_s']:.1f} ({P[p]['staleness_mean']:.2f}; cut {P[p]['frac_queries_hit_timeout']:.0%})"
                 for p in ("gyre", "async", "colocate")]
        rat = []
        for o in ("async", "colocate"):
            x = r["ratios"][o]
            rat.append(f"{x['ratio']:.2f} [{min(x['per_seed']):.2f}-{max(x['per_seed']):.2f}]"
                       + ("" if x["comparable"] else " (not comparable)"))
        k, w = r["knobs"], r["run_work_s"]
        d = r["decomposition"]["async"]
        rat.append(f"{d['work_per_step']:.2f} x {d['in_flight']:.2f} x {d['speed']:.2f}")
        rat.append(f"{P['gyre']['load_cv']:.2f} / {P['async']['load_cv']:.2f}")
        lines.append(f"| {r['point'][knob]:g} | {k['theta']:g}, {k['tau_s']:g}, {k['mu']}, {k['async_train_cells']} | "
                     f"{w['p50']:.1f} / {w['p90']:.1f} / {w['max']:.1f} | {r['train_share']:.0%} | "
                     f"{r['gen_cells_ratio']:.2f} | " + " | ".join(cells) + " | " + " | ".join(rat) + " |")
    return lines


def plot(sweeps: dict[str, list[dict]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_hpc.report.live_plots import save_png

    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.6 * len(sweeps), 3.8), squeeze=False)
    labels = {"train_x": "training cost per token (x live)", "tail_k": "run-duration log-spread (x live)",
              "cells": "cells (batch_groups = cells)"}
    for ax, (knob, rows) in zip(axes[0], sweeps.items()):
        xs = [r["point"][knob] for r in rows]
        for o, mark in (("async", "o"), ("colocate", "s")):
            ys = [r["ratios"][o]["ratio"] for r in rows]
            ax.plot(xs, ys, marker=mark, label=f"gyre x {o}")
            for x, y, r in zip(xs, ys, rows):
                if not r["ratios"][o]["comparable"]:
                    ax.scatter([x], [y], facecolors="none", edgecolors="red", s=140, zorder=5)
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.axhline(1.3, color="0.8", lw=0.8, ls="--")
        ax.set_xlabel(labels[knob])
        ax.set_ylabel("time ratio (other / gyre)")
        if knob in ("train_x", "cells"):
            ax.set_xscale("log")
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
            ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, title="red ring: not comparable", title_fontsize=7)
    return save_png(fig, path)  # atomic, like every plot of a run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--trace", default=TRACE, help="a live run directory to replay (default: %(default)s)")
    ap.add_argument("--overlay", default=OVERLAY, help="the knobs' starting point for all policies alike")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every point and policy alike (after the overlay; repeatable)")
    ap.add_argument("--target", type=float, default=1.0, help="scheduler.staleness_target for every policy")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=24, help="gyre tune simulations per point (--knobs tuned)")
    ap.add_argument("--knobs", choices=("tuned", "overlay"), default="tuned")
    ap.add_argument("--only", nargs="+", choices=list(KNOBS), default=list(KNOBS), help="knobs to sweep")
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks/results/sim_gyre_advantage.md")
    ap.add_argument("--png", type=Path, default=ROOT / "benchmarks/results/sim_gyre_advantage.png")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    args = ap.parse_args(argv)
    overlay = overlay_overrides(ROOT / args.overlay if not Path(args.overlay).is_absolute() else args.overlay)
    overlay += args.sets
    t0 = time.process_time()

    base = Point(args.trace, overlay, args.target, args.steps, BASE)
    breakdown = {p: simulate(base.cfg, p, base.workload(0)) for p in POLICIES}
    whatif = what_ifs(args.trace, overlay, args.target, args.steps)
    cache: dict[tuple, dict] = {}
    sweeps: dict[str, list[dict]] = {}
    for knob in args.only:
        sweeps[knob] = []
        for v in KNOBS[knob]:
            point = {**BASE, knob: v}
            key = tuple(sorted(point.items()))
            if key not in cache:
                cache[key] = run_point(Point(args.trace, overlay, args.target, args.steps, point), args.seeds,
                                       args.budget, args.knobs)
            sweeps[knob].append(cache[key])
    cpu = time.process_time() - t0
    result = {"trace": args.trace, "overlay": args.overlay, "target": args.target, "steps": args.steps,
              "seeds": args.seeds, "knobs": args.knobs, "budget": args.budget, "cpu_s": cpu,
              "breakdown": breakdown, "what_ifs": whatif, "sweeps": sweeps}
    cmd = "python benchmarks/sim_gyre_advantage.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = [f"# Simulated: where gyre's lead over async and colocate comes from ({time.strftime('%Y-%m-%d')})", "",
            f"Command: `{cmd.strip()}` ({cpu:.0f} s CPU). SimWorkload: `{args.trace}` replayed, overlay "
            f"`{args.overlay}`, target E[d] {args.target:g}, {args.steps} steps, seeds {args.seeds}, knobs: "
            f"{args.knobs}" + (f" (gyre tune, budget {args.budget}, per point on seed 0)" if args.knobs == "tuned"
                               else "") + ".", "",
            "## Breakdown at the base point (seed 0, the overlay's knobs)", "",
            "Cell counts are time-averaged over the span (they sum to the cells); run speed is the progress rate "
            "of a generating run relative to an unloaded engine, averaged over runs; generation work / s is "
            "nominal run-seconds completed per second by all engines.", "", *breakdown_table(breakdown), "",
            "## What-ifs at the base point (seed 0, the overlay's knobs, batch_groups = cells)", "",
            *what_if_table(whatif), ""]
    for knob, rows in sweeps.items():
        text += [f"## Sweep: {knob}", "", "Ratios: mean over seeds [min-max per seed]; times in simulated seconds, "
                 "means over seeds.", "", *sweep_table(rows, knob), ""]
    png = plot(sweeps, args.png)
    text += [f"Plot: `{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}`", ""]
    if args.json:
        print(json.dumps(result, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))
    else:
        print("\n".join(text))
    if args.md:  # a hand-written part above MARKER (the findings) is kept; everything below it is regenerated
        head = args.md.read_text().split(MARKER)[0] if args.md.is_file() and MARKER in args.md.read_text() else ""
        atomic_write_text(args.md, (head + MARKER + "\n\n" if head else "") + "\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
