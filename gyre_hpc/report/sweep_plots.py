"""The plot of a sweep (matplotlib, Agg): each metric against the grid elements, failed elements marked.

Invariants
- One PNG, written through a temporary file and a rename; its path is returned.
- Every element has a slot on the x axis; a failed element (or a missing metric) is drawn as a red ``x`` at the
  bottom with its status, never silently left out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gyre_hpc.report.sim_plots import _save  # noqa: E402
from gyre_hpc.sweep import COMPLETED  # noqa: E402


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sweep_plot(rows: Sequence[dict[str, Any]], axes: Sequence[str], metrics: Sequence[str], path: Path,
               title: str) -> Path:
    """One panel per metric, elements on the x axis labelled with their grid values."""
    labels = ["\n".join(f"{k.rsplit('.', 1)[-1]}={r.get(k)}" for k in axes) for r in rows]
    fig, panels = plt.subplots(len(metrics) or 1, 1, figsize=(max(6, 1.1 * len(rows) + 2), 2.6 * max(1, len(metrics))),
                               squeeze=False, sharex=True)
    xs = list(range(len(rows)))
    for ax, metric in zip(panels[:, 0], metrics or ["(no metric)"]):
        ys = [_number(r.get(metric)) if r["status"] == COMPLETED else None for r in rows]
        ok = [(x, y) for x, y in zip(xs, ys) if y is not None]
        ax.bar([x for x, _ in ok], [y for _, y in ok], color="#4c9be8")
        for x, y in zip(xs, ys):
            if y is None:
                ax.plot([x], [0], "x", color="#d62728", markersize=10)
                ax.annotate(rows[x]["status"], (x, 0), textcoords="offset points", xytext=(0, 8), ha="center",
                            color="#d62728", fontsize=8)
        ax.set_ylabel(metric)
        ax.grid(axis="y", alpha=0.3)
    panels[-1, 0].set_xticks(xs)
    panels[-1, 0].set_xticklabels(labels, fontsize=8)
    panels[0, 0].set_title(title)
    return _save(fig, path)
