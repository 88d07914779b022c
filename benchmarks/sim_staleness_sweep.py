"""Simulator staleness sweep: every policy at E[d] targets 0.5, 1, 1.5, 2; hours side by side (table + PNG).

Usage: python benchmarks/sim_staleness_sweep.py [--configs A.yaml B.yaml] [--targets 0.5 1 1.5 2]
                                               [--overlay TUNED.yaml] [--md FILE] [--png FILE]

For each config and target, ``compare`` runs every policy of ``--policies`` on the same workload with
``scheduler.staleness_target`` set (everything else the config's, or the ``gyre tune`` overlay's, alike for all).
The table shows each policy's hours, its *measured* E[d] and its share of queries cut by the timeout; gyre's ratio over a policy is marked "not
comparable" when the two measured E[d] differ by more than 10% (``staleness.comparable``). The PNG plots hours
against the measured E[d], one line per policy, one panel per config: the trade-off of time against
off-policy data. The simulator has no learning model, so the final reward is not part of this sweep (the live
benchmark reports it).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre_hpc.allocator.sim.compare import compare  # noqa: E402
from gyre_hpc.allocator.staleness import comparable  # noqa: E402
from gyre_hpc.config import load_config, overlay_overrides  # noqa: E402
from gyre_hpc.files.io import atomic_write_text  # noqa: E402

POLICIES = ("gyre", "colocate", "async", "async_streaming", "colocate_streaming")


def sweep(config: str, targets: list[float], policies: list[str], sets: list[str]) -> list[dict]:
    """One row per target: {target, policy: (hours, E[d])}."""
    rows = []
    for t in targets:
        cfg = load_config(config, sets + [f"scheduler.staleness_target={t}", f"sim.policies=[{', '.join(policies)}]"])
        result, _ = compare(cfg)
        rows.append({"target": t, **{p: (r["hours"], r["staleness_mean"], r["frac_queries_hit_timeout"])
                                     for p, r in result["policies"].items()}})
    return rows


def table(rows: list[dict], policies: list[str]) -> list[str]:
    others = [p for p in policies if p != "gyre"]
    head = ("| target E[d] | " + " | ".join(f"{p} h (E[d]; cut)" for p in policies) + " | "
            + " | ".join(f"gyre x {p}" for p in others) + " |")
    lines = [head, "|---|" + "---|" * (len(policies) + len(others))]
    for r in rows:
        cells = [f"{r[p][0]:.2f} ({r[p][1]:.2f}; {r[p][2]:.0%})" for p in policies]
        ratios = []
        for p in others:
            x = r[p][0] / r["gyre"][0]
            ratios.append(f"{x:.2f}" + ("" if comparable(r["gyre"][1], r[p][1]) else " (not comparable)"))
        lines.append(f"| {r['target']:g} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


def plot(results: dict[str, list[dict]], policies: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_hpc.report.live_plots import save_png

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.2), squeeze=False)
    for ax, (config, rows) in zip(axes[0], results.items()):
        for p in policies:
            ax.plot([r[p][1] for r in rows], [r[p][0] for r in rows], marker="o", label=p)
        for t in sorted({r["target"] for r in rows}):
            ax.axvline(t, color="0.85", lw=0.8, zorder=0)
        ax.set_title(Path(config).name)
        ax.set_xlabel("measured E[d] (targets: grey lines)")
        ax.set_ylabel("simulated hours")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_png(fig, path)  # atomic, like every plot of a run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["configs/sim/small.yaml", "configs/sim/paper_2p4t.yaml"])
    ap.add_argument("--targets", nargs="+", type=float, default=[0.5, 1.0, 1.5, 2.0])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--overlay", help="a gyre tune overlay applied to every config and policy alike")
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks/results/sim_staleness_sweep.md")
    ap.add_argument("--png", type=Path, default=ROOT / "benchmarks/results/sim_staleness_sweep.png")
    args = ap.parse_args(argv)
    if "gyre" not in args.policies:
        ap.error("--policies must include gyre (the ratios' reference)")
    sets = overlay_overrides(args.overlay) if args.overlay else []
    cmd = "python benchmarks/sim_staleness_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = [f"# Simulator staleness sweep ({time.strftime('%Y-%m-%d')})", "", f"Command: `{cmd.strip()}`", "",
            "Hours of each policy at each target, with its measured E[d] and the share of queries cut by the run "
            "timeout (cut) in brackets; gyre x P = hours(P) / hours(gyre), marked *not comparable* where the two "
            "measured E[d] differ by more than 10%. A policy that cuts more queries at the timeout trains less "
            "work per query: compare the cut shares too.", ""]
    results = {}
    for config in args.configs:
        results[config] = sweep(config, args.targets, args.policies, sets)
        text += [f"## {config}", "", *table(results[config], args.policies), ""]
    png = plot(results, args.policies, args.png)
    text += [f"Plot: `{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}`", ""]
    atomic_write_text(args.md, "\n".join(text))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
