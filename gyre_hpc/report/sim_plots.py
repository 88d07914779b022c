"""Plots of a simulation (matplotlib, Agg backend): role timelines, query durations, staleness.

Invariants
- Every function writes one PNG through a temporary file and a rename, and returns its path.
- Nothing here changes a simulation; plots read the finished ``Simulation`` objects only.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gyre_hpc.allocator.sim.metrics import query_durations  # noqa: E402
from gyre_hpc.allocator.sim.simulator import Simulation  # noqa: E402

COLORS = {"rollout": "#4c9be8", "train": "#e8774c", "draining": "#c9c9c9", "loading": "#8f8f8f", "lost": "#000000"}


def _save(fig: "plt.Figure", path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".png")
    os.close(fd)
    os.chmod(tmp, 0o644)
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def gantt(sim: Simulation, end: float, name: str, path: Path) -> Path:
    """Per-cell role timeline; optimizer steps as ticks on top."""
    n = len(sim.timeline)
    fig, ax = plt.subplots(figsize=(11, 0.5 * n + 1.6))
    for c, events in enumerate(sim.timeline):
        for (t0, role), (t1, _) in zip(events, events[1:] + [(end, "")]):
            if t1 > t0:
                ax.barh(c, (t1 - t0) / 3600, left=t0 / 3600, height=0.8, color=COLORS[role], linewidth=0)
    for t in sim.step_times:
        ax.axvline(t / 3600, color="k", alpha=0.15, linewidth=0.6)
    ax.set_yticks(range(n), [f"cell {c}{' (core)' if c == sim.state.core else ''}" for c in range(n)])
    ax.set_xlabel("hours")
    ax.set_title(f"{name}: cell roles ({len(sim.step_times)} optimizer steps, {end / 3600:.1f} h)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in ("rollout", "train", "draining", "loading")]
    ax.legend(handles, ["rollout", "train", "→train", "→rollout"], loc="upper right", ncol=4, fontsize=8)
    return _save(fig, path)


def query_hist(sim: Simulation, timeout_s: float, name: str, path: Path) -> Path:
    """Histogram of query durations (longest run) with the timeout marked."""
    durations, hit = query_durations(sim)
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.linspace(0, timeout_s / 3600 * 1.05, 43)
    ax.hist(durations / 3600, bins=bins, color="#4c9be8")
    ax.axvline(timeout_s / 3600, color="r", linestyle="--", label=f"timeout {timeout_s / 3600:.1f} h")
    ax.axvline(4.0, color="k", linestyle=":", label="4 h")
    ge4 = (durations >= 4 * 3600).mean() if durations.size else 0.0
    ax.set_title(f"{name}: query duration ({ge4:.1%} >= 4 h, {hit.mean() if hit.size else 0:.1%} hit timeout)")
    ax.set_xlabel("hours (longest run of the query)")
    ax.set_ylabel("queries")
    ax.legend()
    return _save(fig, path)


def staleness_hist(sims: dict[str, Simulation], path: Path) -> Path:
    """Per-token lag distribution of every policy, side by side."""
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(sims))
    for k, (name, sim) in enumerate(sims.items()):
        hist = np.asarray(sim.ledger.hist, dtype=float)
        frac = hist / hist.sum() if hist.sum() else hist
        ax.bar(np.arange(hist.size) + k * width, frac, width=width, label=name)
    ax.set_xlabel("lag d = training version - generating version (per token)")
    ax.set_ylabel("fraction of trained tokens")
    ax.legend()
    return _save(fig, path)


def write_all(sims: dict[str, Simulation], timeout_s: float, out: Path) -> list[Path]:
    """All plots of one comparison under ``out``."""
    paths = [gantt(sim, sim.end, name, out / f"gantt_{name}.png") for name, sim in sims.items()]
    first = "gyre" if "gyre" in sims else next(iter(sims))
    paths.append(query_hist(sims[first], timeout_s, first, out / "query_durations.png"))
    paths.append(staleness_hist(sims, out / "staleness.png"))
    return paths
