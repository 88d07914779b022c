"""The tracker of a live run (edge, rank 0): built from the run's config and resume state, fed by its event log.

::

    run_root:  tracker = for_run(cfg, run_dir, saved)      None when tracking.backends is []
               tee(log, tracker)                            switch_done / group_lost events reach the step window
               on_step → tracker.step; periodic resume save → tracker.kept(step)
               every tracking.images_every_steps steps → tracker.render(render_plots of a copy of the steps)
               end → tracker.finish(summary, PNGs); close(); flush_errors → events.jsonl (tracking_error)

Invariants (tests/integration/test_tracking_live.py)
- A resumed or relaunched run (``saved`` is its resume state) continues the same tracked runs: the run ids and the
  last step each backend took are read from RUN_DIR/tracking/<backend>.json.
- Backends that cannot purge a step take it once rank 0's resume state covers it (run.resume_every_steps > 0),
  so a relaunch from that state never trains a step they already hold.
"""
from __future__ import annotations

import threading
from pathlib import Path

from gyre_hpc.config import TrackingConfig
from gyre_hpc.tracking.sink import Tracker


def for_run(cfg: TrackingConfig, run_dir: Path, saved: dict | None, *, params: dict, hold_steps: bool,
            tags: dict) -> Tracker | None:
    """Rank 0's tracker (None when tracking.backends is []); ``params``: the resolved config as hyperparameters;
    ``hold_steps``: rank 0 saves its resume state periodically (run.resume_every_steps > 0)."""
    if not cfg.backends:
        return None
    return Tracker(cfg, run_dir, params=params, name=Path(run_dir).name,
                   kept=list(saved["steps"]) if saved else None, hold_steps=hold_steps, tags=tags)


def log_replay(run_dir: Path, result: dict, pngs: list[Path]) -> list[dict]:
    """``gyre simulate --trace RUN_DIR --track``: the replay's numbers (``replay/...``) and its predicted-vs-measured
    PNGs go to the run's own tracked runs (same ids, RUN_DIR/tracking), at the run's last step; returns the
    ``tracking_error`` records (never raises)."""
    from gyre_hpc.config import load_config
    from gyre_hpc.tracking.plan import flat_numbers
    from gyre_hpc.tracking.sink import read_state

    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.yaml").tracking
    if not cfg.backends:
        return []
    step = max(read_state(run_dir / "tracking", k).get("upto", 0) for k in cfg.backends)
    t = Tracker(cfg, run_dir, params={}, name=run_dir.name)
    t.scalars(step, flat_numbers(result, "replay"), pngs)
    t.close(finished=True)
    return t.take_errors()


#: matplotlib is not thread-safe: the mid-run renders (a tracking thread) and the run's final report take this lock
PLOT_LOCK = threading.Lock()


def images_due(cfg: TrackingConfig, steps_done: int, total: int) -> bool:
    """Render the report PNGs for the trackers after this step (tracking.images_every_steps; the last step's PNGs
    come from the run's own report)?"""
    every = cfg.images_every_steps
    return every > 0 and 0 < steps_done < total and steps_done % every == 0


def render_plots(run_dir: Path, events_file: str, cells: int, steps: list[dict], seconds: list[float]) -> list[Path]:
    """The report PNGs of the run so far into RUN_DIR/tracking/images (roles, reward, staleness, query_durations)."""
    from gyre_hpc.allocator.eventlog import read_events
    from gyre_hpc.report.live_plots import query_durations, role_timeline, staleness_split
    from gyre_hpc.report.train_plots import reward_curve

    out = Path(run_dir) / "tracking" / "images"
    out.mkdir(parents=True, exist_ok=True)
    with PLOT_LOCK:
        paths = [role_timeline(read_events(Path(run_dir) / events_file), cells, out / "roles.png")]
        rewards = [s["reward"] for s in steps if s.get("reward") is not None]
        if rewards:
            paths.append(reward_curve(rewards, out / "reward.png"))
        if steps:
            paths.append(staleness_split(steps, out / "staleness.png"))
        if seconds:
            paths.append(query_durations(seconds, out / "query_durations.png"))
    return [Path(p) for p in paths]


def tee(log, tracker: Tracker | None) -> None:
    """Every record written to ``log`` (an EventLog) also reaches ``tracker.event``."""
    if tracker is None:
        return
    write = log.write

    def both(record, **fields):
        rec = write(record, **fields)
        tracker.event(rec)
        return rec

    log.write = both


def flush_errors(tracker: Tracker | None, write) -> None:
    """The backends' failures since the last call, as ``tracking_error`` events."""
    if tracker is not None:
        for rec in tracker.take_errors():
            write(rec)
