"""Write a small live run directory in the real record formats (live/root.py, rollouts.py, allocator/executor.py)
for the replay tests: the facts are chosen by the test, so the replay's prediction can be derived by hand."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from gyre_hpc.config import load_config, to_dict

ROOT = Path(__file__).resolve().parents[2]
T0, WALL0 = 50.0, 1_800_000_000.0  # allocator clock and Unix time of the first admission


def _lines(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def write_run(d: Path, overrides: list[str], groups: list[dict], switches: list[dict], steps: list[dict],
              span_s: float, wall_s: float | None, cut_groups: int = 0) -> Path:
    """``groups``: {end_s: [...], tokens, status?: [...], lag?, build?} in admission order (all admitted at T0;
    the harness starts a group ``lag`` s later, its batch is ready ``build`` s after its last run);
    ``switches``: switch_done records (cell, role, timing, total_s); ``steps``: {work_s, trained_tokens,
    optimizer_s}; the last step is at T0 + span_s. ``cut_groups`` more groups were admitted but never ready."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = load_config(ROOT / "configs" / "local.yaml", overrides)
    (d / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    admitted = len(groups) + cut_groups
    ev = [{"t": T0 - 5, "wall": WALL0 - 5, "event": "start", "policy": cfg.scheduler.policy,
           "cells": cfg.cluster.cells, "core": 0, "roles": ["rollout"] * cfg.cluster.cells, "steps": len(steps),
           "streaming": False, "mu": 1},
          {"t": T0 - 1, "wall": WALL0 - 1, "event": "hello", "cell": 0, "rank": 1, "node": "n1", "pid": 1},
          {"t": T0, "wall": WALL0, "event": "order", "order": "admit", "queries": admitted, "started": admitted},
          {"t": T0 + 0.2, "wall": WALL0 + 0.2, "event": "runs", "runs": [1] * cfg.cluster.cells, "ended": 0,
           "parked": 0}]
    for i, s in enumerate(switches):
        ev.append({"t": T0 + 1 + i * 0.01, "wall": WALL0 + 1, "event": "switch_done", "order": i + 1, **s})
    for k, s in enumerate(steps, 1):
        t = T0 + span_s * k / len(steps)
        ev.append({"t": t - 0.1, "wall": WALL0 + t - T0, "event": "train_progress", "cell": 0, "groups": 0,
                   "version": k - 1, "optimizing": False, "work_s": s["work_s"] / 2})
        ev.append({"t": t, "wall": WALL0 + t - T0, "event": "step", "cell": 0, "groups": 1, "version": k,
                   "optimizing": False, "work_s": s["work_s"] / 2, "steps_done": k, "mean_lag": 0.0})
    ev.append({"t": T0 + span_s + 0.5, "wall": WALL0 + span_s + 0.5, "event": "shutdown", "reason": "done"})
    _lines(d / "events.jsonl", ev)
    recs = []
    for gid, g in enumerate(groups):
        status = g.get("status", ["scored"] * len(g["end_s"]))
        t_admit = WALL0 + g.get("lag", 0.0)  # the harness starts the group after the admission order
        recs.append({"gid": gid, "t_admit": t_admit, "t_ready": t_admit + max(g["end_s"]) + g.get("build", 0.0),
                     "trained_tokens": g["tokens"],
                     "runs": [{"end_s": e, "status": s} for e, s in zip(g["end_s"], status)]})
    _lines(d / "groups.jsonl", recs)
    _lines(d / "metrics.jsonl", [{"version": k, "groups": 1, "trained_tokens": s["trained_tokens"],
                                  "optimizer_s": s["optimizer_s"], "save_weights_s": 0.0, "publish_s": 0.0,
                                  "checkpoint_s": 0.0, "loss": 0.1, "staleness_mean": 0.0, "staleness_max": 0,
                                  "lag_tokens": s["trained_tokens"]} for k, s in enumerate(steps, 1)])
    if wall_s is not None:
        (d / "summary.json").write_text(json.dumps({"policy": cfg.scheduler.policy, "wall_s": wall_s}))
    return d
