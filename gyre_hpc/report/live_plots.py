"""Plots of a live run's run directory (matplotlib, Agg backend; an edge module).

- ``role_timeline``: one row per cell, colored by role over time, from the allocator's event log (a switch
  order starts the transition, its ``switch_done`` ends it), with optimizer steps as vertical lines; the
  title gives the share of cell-time in each role.
- ``query_durations``: histogram of the seconds from a query's admission to all its runs ending.
- ``staleness_split``: per optimizer step, the mean per-token staleness as a stack of its pre-queue part
  (generated while the policy moved on) and its in-queue part (waited in the ready buffer), with the step's
  maximum; the bars' heights are the step's ``staleness_mean``.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gyre_hpc.allocator.roles import role_spans  # noqa: E402,F401 (replay_plots imports it from here)
from gyre_hpc.files.io import atomic_write_bytes  # noqa: E402

COLORS = {"rollout": "#4c9be8", "train": "#e8804c", "draining": "#bbbbbb", "loading": "#888888",
          "lost": "#000000"}


def save_png(fig, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` as a PNG (temp file + rename), close it."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def role_timeline(events: Sequence[dict], cells: int, path: Path) -> Path:
    spans = role_spans(events, cells)
    total = {r: sum(b - a for cs in spans for a, b, x in cs if x == r) for r in COLORS}
    all_t = sum(total.values()) or 1.0
    fig, ax = plt.subplots(figsize=(8, 0.6 * cells + 1.5))
    for c, cs in enumerate(spans):
        for a, b, r in cs:
            ax.barh(c, b - a, left=a, color=COLORS[r], edgecolor="none")
    for e in events:
        if e["event"] == "step":
            ax.axvline(e["t"], color="k", lw=0.5, alpha=0.4)
    ax.set_yticks(range(cells), [f"cell {c}" for c in range(cells)])
    ax.set_xlabel("seconds since start (vertical lines: optimizer steps)")
    ax.set_title(" · ".join(f"{r} {total[r] / all_t:.0%}" for r in ("rollout", "train", "draining", "loading")),
                 fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in COLORS]
    ax.legend(handles, list(COLORS), loc="upper right", fontsize=7, ncol=5)
    return save_png(fig, path)


def query_durations(seconds: Sequence[float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(list(seconds), bins=max(5, min(30, len(seconds) // 2 or 1)), color=COLORS["rollout"])
    ax.set_xlabel("query duration (admission to last run ended), s")
    ax.set_ylabel("queries")
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def staleness_split(steps: Sequence[dict], path: Path) -> Path:
    """Stacked per-step mean staleness (pre-queue + in-queue) from the ``train_step`` records."""
    x = [s["version"] for s in steps]
    pre = [s["staleness_prequeue_mean"] for s in steps]
    inq = [s["staleness_inqueue_mean"] for s in steps]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(x, pre, color=COLORS["rollout"], label="pre-queue (policy moved on while generating)")
    ax.bar(x, inq, bottom=pre, color=COLORS["train"], label="in-queue (waited in the ready buffer)")
    ax.plot(x, [s["staleness_max"] for s in steps], "k.", label="max (any token)")
    ax.set_xlabel("policy version after the step")
    ax.set_ylabel("staleness, versions per trained token")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper left", fontsize=7)
    return save_png(fig, path)
