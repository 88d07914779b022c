"""Compare live runs of several policies from their run directories (benchmarks/live_policies.py).

Reads only what a finished run leaves (docs/runtime.md): ``summary.json``, ``metrics.jsonl`` and
``cells/cell*.json``. Plots use matplotlib (Agg): an edge module.

Invariants (tests/unit/test_report_compare.py)
- ``speedups`` pairs repetitions by index and returns the median of the per-repetition ratios
  ``wall(other) / wall(reference)`` (> 1: the reference policy is faster); a repetition where either run
  failed is left out, never counted as a ratio.
- ``switch_breakdown`` keeps the two directions apart and reports, per part, the median over the switches
  that have that part (a rollout→training switch of the core has no weight pull).
- ``pull_throughput`` is bytes / wire seconds per pull (1e9 bytes per GB), the median over pulls.
- ``invalid_reason`` is None only for a run in which no cell was lost and no engine died: a smaller or failing
  machine, not the policy. Runs that hit their timeout are the policy's own outcome (admission waits until every
  rollout engine serves, so none times out for want of a started engine) and stay in the comparison, with their
  share shown beside the wall time (``timed_out_share``).
"""
from __future__ import annotations

import io
import json
import statistics
from pathlib import Path
from typing import Mapping, Sequence

from gyre_hpc.errors import GyreError
from gyre_hpc.files.jsonl import read_objects

R2T_PARTS = ("drain_s", "engine_stop_s", "engine_sleep_s", "trainer_init_s", "weight_pull_s", "total_s")
T2R_PARTS = ("engine_start_s", "engine_wake_s", "register_s", "total_s")


def median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def speedups(walls: Mapping[str, Sequence[float | None]], reference: str) -> dict[str, float | None]:
    """Per other policy: median over repetitions r of walls[other][r] / walls[reference][r]."""
    ref = walls[reference]
    out = {}
    for name, ws in walls.items():
        if name == reference:
            continue
        ratios = [w / r for w, r in zip(ws, ref) if w is not None and r is not None and r > 0]
        out[name] = median(ratios)
    return out


def invalid_reason(summary: dict) -> str | None:
    """Why a finished run does not measure the policy on the workload (shown, left out of the comparison):
    it lost cells (a smaller machine) or an engine died (a failing one)."""
    lost = (summary.get("stop") or {}).get("lost") or []
    if lost:
        return f"cells lost during the run: {lost} (events.jsonl 'lost')"
    if summary.get("engine_deaths"):
        return f"{summary['engine_deaths']} engine death(s) during the run (events.jsonl 'engine_died')"
    return None


def timed_out_share(summary: dict) -> float | None:
    """Of the finished runs, the share that hit the per-run timeout (partial scores included)."""
    statuses = summary.get("run_statuses") or {}
    finished = sum(statuses.values())
    return sum(n for k, n in statuses.items() if k.startswith("timeout")) / finished if finished else None


def read_cells(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(run_dir, "cells").glob("cell*.json"))]


def switch_breakdown(cells: Sequence[dict]) -> dict[str, dict]:
    """{'r2t'|'t2r': {'n': switches, part: median seconds}} over every cell's switches."""
    out = {}
    for key, target, parts in (("r2t", "train", R2T_PARTS), ("t2r", "rollout", T2R_PARTS)):
        sw = [s for c in cells for s in c.get("switches", []) if s.get("to") == target]
        out[key] = {"n": len(sw), **{p: median([s[p] for s in sw if p in s]) for p in parts}}
    return out


def pulls(cells: Sequence[dict]) -> list[dict]:
    return [p for c in cells for p in c.get("pulls", [])]


def pull_throughput(pull_records: Sequence[dict]) -> dict:
    """Median GB/s (bytes / wire seconds), median bytes, number of pulls, all checksums ok."""
    ok = [p for p in pull_records if p.get("seconds", 0) > 0]
    return {"n": len(pull_records), "bytes": median([p["bytes"] for p in ok]),
            "gb_per_s": median([p["bytes"] / p["seconds"] / 1e9 for p in ok]),
            "checksum_ok": bool(pull_records) and all(p.get("checksum_ok") for p in pull_records)}


def reward_curve(run_dir: Path) -> list[float | None]:
    """Mean reward of the runs trained in each optimizer step, in step order."""
    path = Path(run_dir, "metrics.jsonl")
    if not path.exists():
        return []
    recs = [rec for _, rec in read_objects(path, GyreError, torn_tail=True, what="metrics")]
    return [r.get("reward") for r in sorted(recs, key=lambda r: r["version"])]


def plot_rewards(curves: Mapping[str, Sequence[Sequence[float | None]]], path: Path) -> Path:
    """One panel per policy, side by side, one line per repetition (shared y axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_hpc.files.io import atomic_write_bytes

    fig, axes = plt.subplots(1, len(curves), figsize=(3.6 * len(curves), 3.2), sharey=True, squeeze=False)
    for ax, (name, reps) in zip(axes[0], curves.items()):
        for r, ys in enumerate(reps):
            pts = [(i + 1, y) for i, y in enumerate(ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=f"rep {r + 1}")
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean reward of trained runs")
    axes[0][0].legend(fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
