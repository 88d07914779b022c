"""The replay plot (matplotlib, Agg backend; an edge module): the live run's cell roles above the simulator's
prediction for the same policy, on one time axis (seconds since the first admission).

Nothing here changes a simulation or a run directory other than writing the PNG (atomically).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gyre_hpc.allocator.sim.simulator import Simulation  # noqa: E402
from gyre_hpc.report.live_plots import COLORS, role_spans, save_png  # noqa: E402


def _bars(ax, spans: list[list[tuple[float, float, str]]], steps: Sequence[float], title: str) -> None:
    for c, cs in enumerate(spans):
        for a, b, r in cs:
            if b > a:
                ax.barh(c, b - a, left=a, color=COLORS[r], edgecolor="none")
    for t in steps:
        ax.axvline(t, color="k", lw=0.5, alpha=0.4)
    ax.set_yticks(range(len(spans)), [f"cell {c}" for c in range(len(spans))])
    ax.set_title(title, fontsize=9)


def measured_vs_predicted(events: Sequence[dict], sim: Simulation, policy: str, path: Path) -> Path:
    """Two role timelines (measured, simulated) sharing the x axis; vertical lines are optimizer steps."""
    t0 = next(e["t"] for e in events if e["event"] == "order" and e.get("order") == "admit")
    live = [[(max(a - t0, 0.0), b - t0, r) for a, b, r in cs if b > t0] for cs in role_spans(events, len(sim.timeline))]
    live_steps = [e["t"] - t0 for e in events if e["event"] == "step"]
    end = sim.end
    predicted = [[(a, b, r) for (a, r), (b, _) in zip(ev, ev[1:] + [(end, "")])] for ev in sim.timeline]
    n = len(sim.timeline)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 1.2 * n + 2), sharex=True)
    _bars(top, live, live_steps, f"measured ({policy}): last step at {live_steps[-1] if live_steps else 0:.1f} s")
    _bars(bottom, predicted, sim.step_times, f"simulated ({policy}): last step at {end:.1f} s")
    bottom.set_xlabel("seconds since the first admission (vertical lines: optimizer steps)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in COLORS]
    top.legend(handles, list(COLORS), loc="upper right", fontsize=7, ncol=5)
    return save_png(fig, path)
