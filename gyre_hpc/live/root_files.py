"""What rank 0 of a live run reads and writes in RUN_DIR besides the event log (edge: files, plots): the resume state
it loads, saves at a preemption or a lost rank, or after an error at a quiet point; the ``error`` event; the summary
and the report PNGs of a finished run (``gyre_hpc.live.root`` drives them).

Invariants (tests/integration/test_live_training.py, tests/unit/test_root_run.py)
- The summary is computed from the step records, the events and the cells' stats, never estimated; a resumed
  run's covers every segment (the saved step records and counters plus the new ones).
- A save that fails is an event (``preempt_failed``, ``lost_rank_unsaved``) and an ``end`` entry, never raised:
  the shutdown goes on; ``resume_after_error`` saves only at a quiet point (no step out, the last one applied).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from gyre_hpc.allocator.eventlog import EventLog, read_events
from gyre_hpc.allocator.roles import role_share
from gyre_hpc.config import GyreConfig
from gyre_hpc.errors import ConfigError, GyreError
from gyre_hpc.files.io import atomic_write_text
from gyre_hpc.lifecycle import recovery, resume
from gyre_hpc.lifecycle.recovery import StopKind, StopReason
from gyre_hpc.live import dataloss, lost, preempt
from gyre_hpc.live.hub import Hub
from gyre_hpc.live.rollouts import Rollouts
from gyre_hpc.tracking import live as tracking
from gyre_hpc.train import agreement

if TYPE_CHECKING:
    from gyre_hpc.live.root_server import LiveServer

REPORT_PNGS = ("roles", "reward", "staleness", "query_durations")


def close_tracker(run_dir: Path, events_file: str, transport, tracker, finished: bool) -> None:
    """Let the backends take what they hold (tracking.close_timeout_s at most); their failures as events."""
    tracker.close(finished=finished)
    log = EventLog(run_dir / events_file, transport.clock)
    try:
        tracking.flush_errors(tracker, log.write)
    finally:
        log.close()


def load_resume(cfg: GyreConfig, run_dir: Path) -> dict | None:
    """The resume state of ``run_dir`` if it holds one (checked before any process starts its work)."""
    if not resume.exists(run_dir):  # (RUN_DIR/config.yaml is there: live.rank.run_rank keeps it, gyre_hpc.rundir)
        return None
    saved = resume.load(run_dir)
    if saved["sched"]["steps_done"] >= cfg.allocator.steps:
        raise ConfigError(f"allocator.steps: {cfg.allocator.steps}, but {run_dir} has "
                          f"{saved['sched']['steps_done']} steps done already; ask for more steps")
    (run_dir / "weights" / "LATEST.json").unlink(missing_ok=True)  # its transfer descriptor died with the run
    return saved


def resume_after_error(run_dir: Path, server, hub, rollouts, steps: list[dict], carry: dict,
                        exc: BaseException) -> str | None:
    """Rank 0 failed: a resume state if the run stands at a quiet point (the allocator applied the core's last step
    and no step is out), as for a preemption; else None. Best effort (the error may be a full disk)."""
    if isinstance(exc, KeyboardInterrupt) or server is None or hub is None or rollouts is None or not server.started:
        return None  # not started: nothing new to save (a resumed run's earlier state stays as it was)
    if hub.step_pending or not steps and hub.version:
        return None
    try:
        rollouts.close()
        state = preempt.snapshot(server, hub, rollouts, steps, carry, 0.0)
        resume.save(run_dir, state, preempt.checkpoint_dir(run_dir))
    except (GyreError, OSError):
        return None
    return str(resume.resume_dir(run_dir))


def error_event(run_dir: Path, events_file: str, transport, exc: BaseException, resume_at: str | None) -> None:
    """An unrecoverable error on rank 0: one ``error`` event in events.jsonl (best effort: the disk may be full)."""
    if isinstance(exc, KeyboardInterrupt):
        return
    rec = {"event": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "resume": resume_at}
    try:
        log = EventLog(run_dir / events_file, transport.clock)
        try:
            log.write(rec)
        finally:
            log.close()
    except OSError:
        pass


def restore(saved: dict, run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, policy,
             reissue: bool) -> None:
    groups = preempt.restore(saved, server, hub, rollouts, server.clock.now(), reissue)
    atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(s) + "\n" for s in saved["steps"]))
    st = server.state
    server.log.write({"event": "resumed", "version": st.version, "steps_done": st.steps_done,
                      "buffer": [g.gid for g in groups], "trained_batches": st.trained_batches,
                      "lag_sum": st.lag_sum, "window": policy.window(st), "next_gid": rollouts.next_gid,
                      "segment": saved["counters"]["segments"] + 1,
                      "reissued": preempt.reissued(saved, reissue),
                      "dropped": [] if reissue else list(saved.get("inflight", []))})


def save_resume(run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, steps: list[dict],
                 carry: dict, policy, preemption: preempt.Preemption, end: dict, wall_s: float) -> None:
    """Write RUN_DIR/resume; a failure is logged (``preempt_failed``) and the shutdown goes on."""
    state = preempt.snapshot(server, hub, rollouts, steps, carry, wall_s)
    st = server.state
    try:
        resume.save(run_dir, state, preempt.checkpoint_dir(run_dir))
    except (GyreError, OSError) as exc:
        end["preempt_error"] = str(exc)
        server.log.write({"event": "preempt_failed", "error": str(exc)})
        return
    end["saved"] = True
    (run_dir / recovery.REQUEST_FILE).unlink(missing_ok=True)  # served: a resumed run must not stop at once
    server.log.write({"event": "preempted", "signal": preemption.signal, "version": state["version"],
                      "steps_done": st.steps_done, "buffer": [g["gid"] for g in state["buffer"]],
                      "trained_batches": st.trained_batches, "lag_sum": st.lag_sum, "window": policy.window(st),
                      "next_gid": state["next_gid"], "inflight": state["inflight"],
                      "resume": str(resume.resume_dir(run_dir))})


def save_lost(run_dir: Path, server: "LiveServer", hub: Hub, rollouts: Rollouts, steps: list[dict],
               carry: dict, end: dict, wall_s: float) -> None:
    """A rank is lost: RUN_DIR/resume from what rank 0 holds (live.lost); a failure is logged, never raised."""
    try:
        state = lost.snapshot(server, hub, rollouts, steps, carry, wall_s)
        path = lost.save(run_dir, state)
    except (GyreError, OSError) as exc:
        end["lost_error"] = str(exc)
        server.log.write({"event": "lost_rank_unsaved", "error": str(exc)})
        return
    end["lost_saved"] = str(path)
    server.log.write({"event": "lost_rank_saved", "version": state["version"],
                      "steps_done": state["sched"]["steps_done"], "buffer": [g["gid"] for g in state["buffer"]],
                      "inflight": state["inflight"], "resume": str(path),
                      "after_signal_s": round(server.teardown.since_s(), 3)})


def summary(cfg: GyreConfig, run_dir: Path, stop: dict, steps: list[dict], rollouts: Rollouts, end: dict, carry: dict,
             wall: float) -> dict:
    cells = [json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("cell*.json"))]
    switches = [s for c in cells for s in c["switches"]]
    pulls = [p for c in cells for p in c["pulls"]]
    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    lag_tokens = sum(s["lag_tokens"] for s in steps)
    proxy = end.get("proxy", {})
    records = read_events(run_dir / cfg.allocator.events_file)
    events = [e["event"] for e in records]
    statuses = [s for g in rollouts.groups for s in g["statuses"]]
    loss = dataloss.summary(rollouts.groups)
    return {
        "policy": cfg.scheduler.policy, "steps": len(steps), "wall_s": round(carry.get("wall_s", 0.0) + wall, 2),
        "segments": carry.get("segments", 0) + 1,
        "switches_r2t": sum(s["to"] == "train" for s in switches),
        "switches_t2r": sum(s["to"] == "rollout" for s in switches),
        "weight_pulls": len(pulls),
        "weight_pull_checksum_ok": bool(pulls) and all(p["checksum_ok"] for p in pulls),
        "runs_finished": carry.get("runs_finished", 0) + rollouts.ended_runs, "runs_scored": sum(len(g["rewards"]) for g in rollouts.groups),
        "run_statuses": {k: statuses.count(k) for k in sorted(set(statuses))},
        "runs_lost": (proxy.get("runs_lost") or 0) + loss["runs_lost_in_groups"],
        "groups_lost": loss["groups_lost"], "lost_groups": loss["lost_groups"],
        "calls_late": proxy.get("calls_late", 0), "outcomes_recovered": proxy.get("outcomes_recovered", 0),
        "runs_moved": proxy.get("runs_moved"),
        "calls_moved": proxy.get("moves"), "groups_cut_at_stop": end.get("groups_cut", 0),
        "runs_moved_kv": proxy.get("runs_moved_kv"),  # runs with a move whose KV blocks went over Mooncake
        "moves_by_kind": {k: proxy.get(f"moves_{k}") for k in ("kv", "reprefill")},
        "kv_move_median_s": proxy.get("kv_move_median_s"),
        "prefix_hit_rate": (round(proxy["cached_tokens"] / proxy["prompt_tokens"], 4)
                            if proxy.get("prompt_tokens") else None),  # engines' cached_tokens / prompt tokens
        "engine_deaths": events.count("engine_died"), "engine_restarts": events.count("engine_restarted"),
        "engine_kind": cfg.engine.kind,  # each live engine's /model_info weight_version when its cell ended
        "engine_weight_versions": {f"cell{c['cell']}": c["engine_weight_version"] for c in cells
                                   if c.get("engine_weight_version") is not None},
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        "staleness_mean": (sum(s["staleness_mean"] * s["lag_tokens"] for s in steps) / lag_tokens
                           if lag_tokens else 0.0),
        "staleness_max": max((s["staleness_max"] for s in steps), default=0),
        **{f"staleness_{part}_{stat}": _staleness(steps, f"staleness_{part}_{stat}")
           for part in ("prequeue", "inqueue") for stat in ("mean", "max")},
        **agreement.combine(steps),  # train-inference logprob agreement over every step's first forwards
        "role_share": role_share(records, cfg.cluster.cells),  # of cell-time: roles.png's title (loading = restarts)
        "switch_s": {d: _median([s[f"{d}_s"] for s in switches if f"{d}_s" in s])
                     for d in ("total", "drain", "engine_stop", "engine_sleep", "weight_pull", "engine_start",
                               "engine_wake")},
        "queries_reissued": carry.get("queries_reissued", 0),
        "queries_dropped_at_preempt": carry.get("queries_dropped_at_preempt", 0),
        "workers": sum(max(c.get("workers_trained", 0), c.get("workers_served", 0)) for c in cells),  # that worked
        "parallel": next((s["parallel"] for s in reversed(steps) if s.get("parallel")), None),  # the last step's
        "build_errors": rollouts.errors, "stop": stop, "run_dir": str(run_dir),
        **({"error": reason.detail} if (reason := StopReason.parse(stop["reason"])).kind is StopKind.DATA_LOSS else {}),
    }


def _staleness(steps: list[dict], key: str) -> float:
    """A staleness field over the whole run: maxima of the steps, or means weighted by trained tokens."""
    if key.endswith("_max"):
        return max((s.get(key, 0) for s in steps), default=0)
    tokens = sum(s["lag_tokens"] for s in steps)
    return sum(s.get(key, 0.0) * s["lag_tokens"] for s in steps) / tokens if tokens else 0.0


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def report(run_dir: Path, events_file: str, cells: int, steps: list[dict], rollouts: Rollouts) -> None:
    from gyre_hpc.allocator.eventlog import read_events
    from gyre_hpc.report.live_plots import query_durations, role_timeline, staleness_split
    from gyre_hpc.report.train_plots import reward_curve

    rewards = [s["reward"] for s in steps if s.get("reward") is not None]
    if rewards:
        reward_curve(rewards, run_dir / "reward.png")
    role_timeline(read_events(run_dir / events_file), cells, run_dir / "roles.png")
    query_durations([g["seconds"] for g in rollouts.groups], run_dir / "query_durations.png")
    if steps:
        staleness_split(steps, run_dir / "staleness.png")
