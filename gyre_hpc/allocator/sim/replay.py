"""Replay a live run in the simulator: its run directory → the simulator's inputs → predicted vs measured.

What is read (docs/runtime.md has the run directory)::

    config.yaml    the same scheduler section (policy, B, staleness target, theta, tau, mu), cells, steps
    groups.jsonl   per ready group: admission time, each run's end (s after admission) and status, trained tokens
    events.jsonl   admissions (groups still running at the stop), switch_done timings, train_progress work_s,
                   the first admission and the last optimizer step (the scheduled span)
    metrics.jsonl  per step: optimizer, save_weights, publish and checkpoint seconds
    summary.json   wall_s (optional: without it only the span is compared)

What the simulator gets (``calibrate``)::

    workload   one trace run per live run, in admission order; duration = the run's end - its group's admission
               order (events.jsonl) + the group's TITO flush and batch build (groups.jsonl: t_ready - last run end),
               measured under the live engines' load, so the simulator does not stretch it again
               (sim.half_load, sim.kv_slots_per_cell: unbounded) -- except on an emulated device (engine.device_tick_s
               > 0) with ``runs`` records: then the measured load is taken out of each duration and the device's
               curve given to the simulator (``sim/engine_load.py``, ``_engine_load``); a run that timed out never finishes; a group
               still running at the stop lasts at least until the stop (censored there); tokens per run = the
               group's trained tokens / runs, all trained
    training   sim.train_tok_s_per_cell = sum of trained tokens / sum of the cells' reported work_s;
               sim.optimizer_s = mean of optimizer + save_weights + publish + checkpoint seconds per step
    switches   sim.to_train_s = mean (order → done - trainer_init - weight_pull) of rollout→train switches,
               the satellite pull = mean (trainer_init + weight_pull) of satellites' rollout→train switches,
               sim.to_rollout_s = mean order → done of train→rollout switches (means: the simulator charges one
               value per switch, so the mean keeps the measured total); a kind of switch the run never made
               (async) keeps the config's value, listed in ``calibration.from_config``

Lost cells are not replayed (the simulator keeps every cell); ``calibration.lost_cells`` lists them. A resumed
run (several ``start`` records) is refused.

Prediction: ``span`` = time of the last optimizer step - time of the first admission (the scheduled part);
``sim_wall_s`` = wall_s - measured span + simulated span (start-up and teardown are taken as measured);
``sim_error_pct`` = 100 (sim_wall_s - wall_s) / wall_s, ``sim_span_error_pct`` the same on the span.

Invariants (tests/unit/test_sim_replay.py)
- The same run directory gives the same prediction (the simulator is deterministic).
- A missing or malformed file fails with ``WorkloadError`` naming ``file`` or ``file:line`` before any simulation.
- Runs whose durations, training cost and switch cost are known give the span derived by hand.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.allocator.policies import validate
from gyre_hpc.allocator.sim.compare import queries_needed, simulate_policy
from gyre_hpc.allocator.sim.engine_load import Curve, LoadSeries, calls_by_run, run_nominal
from gyre_hpc.allocator.sim.workload import SimWorkload
from gyre_hpc.config import GyreConfig, apply_overrides, build, read_yaml, to_dict
from gyre_hpc.errors import ConfigError, GyreError, SchedulingError, WorkloadError
from gyre_hpc.files.jsonl import read_objects

UNBOUNDED = 1e12  # sim.half_load / kv_slots_per_cell: measured durations already hold the live load
PULL_BYTES_PER_S = 1e9
WHAT_IF = ("gyre", "colocate", "async")


@dataclass(frozen=True)
class LiveRun:
    """The facts of one live run, read from its directory."""

    cfg: GyreConfig
    groups: list[dict]      # per admitted group, in gid order: t_admit, end_s per run, statuses, tokens, censored
    events: list[dict]
    steps: list[dict]       # metrics.jsonl
    wall_s: float | None
    path: Path


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) per line; a torn final line (no newline) is skipped, like ``read_events``."""
    if not path.is_file():
        raise WorkloadError(f"{path}: missing (not a gyre train run directory, or one written before runs "
                            "recorded what the replay needs: rerun it)")
    return read_objects(path, WorkloadError, torn_tail=True, what="run record")


def _num(rec: dict, key: str, where: str) -> float:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise WorkloadError(f"{where}: {key} must be a number >= 0, got {v!r}")
    return float(v)


def _group(rec: dict, where: str) -> dict:
    runs = rec.get("runs")
    if not isinstance(rec.get("gid"), int) or not isinstance(runs, list) or not runs:
        raise WorkloadError(f"{where}: a group needs an integer gid and a non-empty list of runs")
    for r in runs:
        if not isinstance(r, dict) or not isinstance(r.get("status"), str):
            raise WorkloadError(f"{where}: each run needs end_s and a status, got {r!r}")
        _num(r, "end_s", where)
    ends = [r["end_s"] for r in runs]
    build_s = _num(rec, "t_ready", where) - _num(rec, "t_admit", where) - max(ends)
    return {"gid": rec["gid"], "t_admit": rec["t_admit"], "end_s": ends, "build_s": max(build_s, 0.0),
            "timed_out": [r["status"].startswith("timeout") for r in runs],
            "tokens": _num(rec, "trained_tokens", where), "censored": False}


def _from_admission(g: dict, admitted: float) -> dict:
    """Runs timed from the allocator's admission order (the simulator's Admit), not from the harness's start of
    the group (it lags on a loaded machine), plus the group's TITO flush and batch build before it is ready."""
    shift = max(g["t_admit"] - admitted, 0.0) + g["build_s"]
    return {**g, "t_order": admitted, "end_s": [e + shift for e in g["end_s"]]}


_NEEDS = {"switch_done": ("cell", "total_s"), "step": ("t",), "order": ("t", "wall"), "shutdown": ("wall",)}


def _check_events(events: list[dict], path: Path) -> None:
    """The fields the replay reads, on the records it reads (line n of the log is ``events[n - 1]``)."""
    for n, e in enumerate(events, 1):
        where = f"{path}:{n}"
        for key in _NEEDS.get(e["event"], ()):
            _num(e, key, where)
        if "work_s" in e:
            _num(e, "work_s", where)
        if e["event"] == "switch_done" and (e.get("role") not in ("train", "rollout")
                                            or not isinstance(e.get("timing"), dict)):
            raise WorkloadError(f"{where}: switch_done needs role train or rollout and a timing object")
        if e.get("order") == "admit":
            _num(e, "started", where)


def _admissions(events: list[dict], path: Path) -> list[float]:
    """Wall time of the admission of every group, in gid order (the harness numbers groups as admitted)."""
    out = []
    for e in events:
        if e["event"] == "order" and e.get("order") == "admit":
            out += [float(e["wall"])] * int(e.get("started", 0))
    if not out:
        raise WorkloadError(f"{path}: no admission (order admit) in the event log: the run never started")
    return out


def read_run(run_dir: str | Path) -> LiveRun:
    """Read and check a live run directory; errors name the file (and line)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise WorkloadError(f"--trace: {d} is not a directory (give a gyre train run directory)")
    try:
        cfg = build(GyreConfig, read_yaml(d / "config.yaml"))
    except ConfigError as exc:
        raise WorkloadError(f"{d / 'config.yaml'}: {exc}") from None
    ev_path = d / cfg.allocator.events_file
    if not ev_path.is_file():
        raise WorkloadError(f"{ev_path}: missing (the allocator's event log)")
    events = read_events(ev_path)
    _check_events(events, ev_path)
    if sum(e["event"] == "start" for e in events) > 1:
        raise WorkloadError(f"{ev_path}: the run was resumed (several segments); the replay covers one segment only")
    ready = {}
    for n, rec in _jsonl(d / "groups.jsonl"):
        g = _group(rec, f"{d / 'groups.jsonl'}:{n}")
        ready[g["gid"]] = g
    admits = _admissions(events, ev_path)
    stop_wall = next((e["wall"] for e in events if e["event"] == "shutdown"), events[-1]["wall"])
    groups = [_from_admission(ready[gid], t) if gid in ready else _censored(gid, t, stop_wall, cfg.agent.runs_per_group)
              for gid, t in enumerate(admits)]
    steps = [rec for _, rec in _jsonl(d / "metrics.jsonl")]
    for n, rec in enumerate(steps, 1):
        for key in ("trained_tokens", "optimizer_s"):
            _num(rec, key, f"{d / 'metrics.jsonl'}:{n}")
    if not steps:
        raise WorkloadError(f"{d / 'metrics.jsonl'}: no optimizer step was recorded; nothing to replay")
    wall = None
    if (d / "summary.json").is_file():
        wall = json.loads((d / "summary.json").read_text()).get("wall_s")
    return LiveRun(cfg, groups, events, steps, wall, d)


def _censored(gid: int, t_admit: float, stop_wall: float, runs: int) -> dict:
    return {"gid": gid, "t_admit": t_admit, "t_order": t_admit, "end_s": [max(stop_wall - t_admit, 0.0)] * runs,
            "timed_out": [False] * runs, "tokens": math.nan, "censored": True}


@dataclass(frozen=True)
class Calibration:
    workload: SimWorkload
    sim: dict[str, Any]       # the sim section's values measured on the run
    span_s: float             # measured: first admission → last optimizer step
    facts: dict[str, Any]     # counts for the report


def _mean(xs: Sequence[float], default: float = 0.0) -> float:
    return float(np.mean(xs)) if len(xs) else default


_Load = tuple[Curve, LoadSeries, dict]  # the engines' curve, the measured load, call intervals per (gid, run)


def _workload(groups: list[dict], timeout_s: float, load: _Load | None = None) -> SimWorkload:
    """One trace run per live run; with ``load`` each duration becomes nominal work (``sim/engine_load.py``: exactly
    from its calls where the TITO has them, else through the curve's tool fraction), else it is taken as measured."""
    known = [g["tokens"] for g in groups if not g["censored"]]
    fill = _mean(known)
    work, rate = [], []
    for g in groups:
        per_run = (fill if g["censored"] else g["tokens"]) / len(g["end_s"])
        ends = np.maximum(np.array(g["end_s"], dtype=float), 1e-6)
        if load is not None:
            ends = np.maximum([_nominal(load, g, i, e) for i, e in enumerate(ends.tolist())], 1e-6)
        for w, out in zip(ends.tolist(), g["timed_out"]):
            work.append(math.inf if out else w)
            rate.append(per_run / (max(timeout_s, w) if out and load is None else w))
    offsets = np.concatenate([[0], np.cumsum([len(g["end_s"]) for g in groups])])
    tool_frac = 0.0 if load is None else load[0].tool_frac
    return SimWorkload(np.array(work), np.array(rate), np.full(len(work), math.inf), offsets, tool_frac)


def _nominal(load: _Load, g: dict, i: int, end: float) -> float:
    curve, series, calls = load
    mine = calls.get((g["gid"], i))
    if mine is not None and not g["censored"]:
        return run_nominal(series, curve.half_load, curve.slots, end, mine)[0]
    return float(curve.nominal(series, np.array([g["t_order"]]), np.array([g["t_order"] + end]))[0])


def _engine_load(run: LiveRun) -> tuple[_Load | None, dict[str, Any]]:
    """The engines' load curve and the measured load, when both are known: an emulated device (engine.device_tick_s
    > 0: its curve is the config's) and ``runs`` records in the event log. Else None (durations as measured).
    The tool fraction is that of the runs with call records (0 without any)."""
    eng = run.cfg.engine
    series = LoadSeries.from_events(run.events)
    if eng.device_tick_s <= 0 or series is None:
        why = "no emulated device (engine.device_tick_s 0)" if eng.device_tick_s <= 0 else "no runs records"
        return None, {"engine_load": None, "engine_load_why_not": why}
    calls = calls_by_run(run.path / "tito")
    slots = float(eng.max_running_requests)
    parts = [run_nominal(series, eng.device_half_load, slots, e, calls[(g["gid"], i)])
             for g in run.groups if not g["censored"] for i, e in enumerate(g["end_s"]) if (g["gid"], i) in calls]
    nominal, tool = sum(p[0] for p in parts), sum(p[1] for p in parts)
    curve = Curve(eng.device_half_load, slots, tool / nominal if nominal > 0 else 0.0)
    return (curve, series, calls), {"engine_load": {"half_load": curve.half_load, "slots": eng.max_running_requests,
                                                    "tool_frac": curve.tool_frac, "runs_with_calls": len(parts),
                                                    "mean_load": float(np.mean(series.load))}}


def _switches(events: list[dict], core: int) -> tuple[dict[str, float], list[str]]:
    """(the sim keys measured on the run's switches, the keys it had no switch for: they keep the config's)."""
    done = [e for e in events if e["event"] == "switch_done"]
    r2t = [e for e in done if e["role"] == "train"]
    t2r = [e for e in done if e["role"] == "rollout"]
    extra = [e["timing"].get("trainer_init_s", 0.0) + e["timing"].get("weight_pull_s", 0.0) for e in r2t]
    sat = [x for e, x in zip(r2t, extra) if e["cell"] != core]
    measured = {"to_train_s": (r2t, lambda: max(0.0, _mean([e["total_s"] - x for e, x in zip(r2t, extra)]))),
                "to_rollout_s": (t2r, lambda: _mean([e["total_s"] for e in t2r])),
                "weight_bytes": (sat, lambda: max(_mean(sat), 1e-9) * PULL_BYTES_PER_S),
                "pull_bytes_per_s": (sat, lambda: PULL_BYTES_PER_S)}
    return ({k: f() for k, (xs, f) in measured.items() if xs},
            [k for k, (xs, _) in measured.items() if not xs and k != "pull_bytes_per_s"])


def calibrate(run: LiveRun) -> Calibration:
    """The simulator's inputs measured on ``run`` (module docstring)."""
    ev = run.events
    work_s = sum(e.get("work_s", 0.0) for e in ev if e["event"] in ("train_progress", "step"))
    tokens = sum(s["trained_tokens"] for s in run.steps)
    if work_s <= 0:
        raise WorkloadError(f"{run.path / run.cfg.allocator.events_file}: no train_progress record carries work_s "
                            "(the training time); the run directory was written by an older gyre")
    first = next(e["t"] for e in ev if e["event"] == "order" and e.get("order") == "admit")
    last = [e["t"] for e in ev if e["event"] == "step"]
    if not last:
        raise WorkloadError(f"{run.path / run.cfg.allocator.events_file}: no optimizer step in the event log")
    sw, unmeasured = _switches(ev, core=0)
    opt = [s["optimizer_s"] + sum(s.get(k, 0.0) for k in ("save_weights_s", "publish_s", "checkpoint_s"))
           for s in run.steps]
    load, load_facts = _engine_load(run)
    sim = {"steps": len(last), "train_tok_s_per_cell": max(tokens, 1.0) / work_s, "optimizer_s": _mean(opt),
           **sw, "half_load": UNBOUNDED, "kv_slots_per_cell": int(UNBOUNDED), "kv_transfer_s": 0.0,
           "reprefill_tokens": 0.0}
    if load is not None:
        sim.update(half_load=load[0].half_load, engine_slots=run.cfg.engine.max_running_requests, load_model="calls")
    timeout = run.cfg.agent.timeout_s
    facts = {"groups": len(run.groups), "censored_groups": sum(g["censored"] for g in run.groups),
             "runs": sum(len(g["end_s"]) for g in run.groups),
             "timed_out_runs": sum(sum(g["timed_out"]) for g in run.groups),
             "train_work_s": work_s, "trained_tokens": tokens, "from_config": unmeasured,
             "switches_r2t": sum(e["event"] == "switch_done" and e["role"] == "train" for e in ev),
             "switches_t2r": sum(e["event"] == "switch_done" and e["role"] == "rollout" for e in ev),
             "lost_cells": sorted({e["cell"] for e in ev if e["event"] == "lost"}), **load_facts}
    return Calibration(_workload(run.groups, timeout, load), sim, last[-1] - first, facts)


def replay_config(run: LiveRun, cal: Calibration, policies: Sequence[str], overrides: Sequence[str] = ()) -> Any:
    """The run's config with the measured sim section; ``overrides`` (``--set``) apply last."""
    data = to_dict(run.cfg)
    data["sim"] = {**data["sim"], **cal.sim, "policies": list(policies)}
    data["workload"] = {**data["workload"], "trace": None, "timeout_h": run.cfg.agent.timeout_s / 3600.0}
    return build(GyreConfig, apply_overrides(data, overrides))


def _valid(name: str, cfg: GyreConfig) -> str | None:
    try:
        validate(name, cfg.scheduler, cfg.cluster.cells)
    except GyreError as exc:
        return str(exc)
    return None


def replay(run_dir: str | Path, what_if: bool = True, overrides: Sequence[str] = ()) -> tuple[dict, dict]:
    """(JSON-ready result, Simulation per policy) of replaying ``run_dir``: the live policy first, then the
    what-if policies that are valid for the run's cells."""
    run = read_run(run_dir)
    cal = calibrate(run)
    live = run.cfg.scheduler.policy
    names = [live] + ([p for p in WHAT_IF if p != live] if what_if else [])
    cfg = replay_config(run, cal, names, overrides)
    wl = cal.workload.take(queries_needed(cfg))
    predicted, sims, skipped = {}, {}, {}
    for name in names:
        if (why := _valid(name, cfg)) is not None:
            skipped[name] = why
            continue
        try:
            sims[name], r = simulate_policy(cfg, name, wl)
        except SchedulingError as exc:
            if name == live:
                raise
            skipped[name] = f"the simulation failed: {exc}"
            continue
        predicted[name] = _prediction(r, run.wall_s, cal.span_s)
    return _result(run, cal, cfg, predicted, skipped), sims


def _prediction(r: dict, wall: float | None, span: float) -> dict:
    sim_span = r["hours"] * 3600.0
    out = {"span_s": sim_span, "wall_s": None if wall is None else wall - span + sim_span,
           "span_error_pct": 100.0 * (sim_span - span) / span if span > 0 else None}
    out["error_pct"] = None if wall is None else 100.0 * (out["wall_s"] - wall) / wall
    out.update({k: r[k] for k in ("train_idle_frac", "rollout_idle_frac", "switches", "staleness_mean",
                                  "staleness_max", "queries_completed")})
    return out


def _result(run: LiveRun, cal: Calibration, cfg: GyreConfig, predicted: dict, skipped: dict) -> dict:
    live = predicted.get(run.cfg.scheduler.policy, {})
    sim_keys = ("train_tok_s_per_cell", "optimizer_s", "to_train_s", "to_rollout_s")
    pull = {"pull_s": cfg.sim.weight_bytes / cfg.sim.pull_bytes_per_s}
    return {"run_dir": str(run.path), "policy": run.cfg.scheduler.policy, "cells": cfg.cluster.cells,
            "steps": cal.sim["steps"], "batch_groups": cfg.scheduler.batch_groups,
            "measured": {"wall_s": run.wall_s, "span_s": cal.span_s},
            "calibration": {**{k: getattr(cfg.sim, k) for k in sim_keys}, **pull, **cal.facts},
            "sim_wall_s": live.get("wall_s"), "sim_span_s": live.get("span_s"),
            "sim_error_pct": live.get("error_pct"), "sim_span_error_pct": live.get("span_error_pct"),
            "predicted": predicted, "skipped": skipped}


def live_prediction(run_dir: str | Path, wall_s: float) -> dict:
    """The keys a live run's summary gets (``sim_wall_s``, ``sim_error_pct``, ...); a replay that cannot run
    says why in ``sim_error`` instead of failing the run."""
    try:
        result, _ = replay(run_dir, what_if=False)
    except GyreError as exc:
        return {"sim_wall_s": None, "sim_error_pct": None, "sim_error": str(exc)}
    span, err = result["sim_span_s"], result["sim_span_error_pct"]
    wall = wall_s - result["measured"]["span_s"] + span
    return {"sim_wall_s": round(wall, 2), "sim_error_pct": round(100.0 * (wall - wall_s) / wall_s, 2),
            "sim_span_s": round(span, 2), "sim_span_error_pct": None if err is None else round(err, 2),
            "measured_span_s": round(result["measured"]["span_s"], 2)}
