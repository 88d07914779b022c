"""The tracker of a live run (edge, rank 0): built from the run's config and resume state, fed by its event log.

::

    run_root:  tracker = for_run(cfg, run_dir, saved)      None when tracking.backends is []
               tee(log, tracker)                            switch_done / group_lost events reach the step window
               on_step → tracker.step; periodic resume save → tracker.kept(step)
               end → tracker.finish(summary, PNGs); close(); flush_errors → events.jsonl (tracking_error)

Invariants (tests/integration/test_tracking_live.py)
- A resumed or relaunched run (``saved`` is its resume state) continues the same tracked runs: the run ids and the
  last step each backend took are read from RUN_DIR/tracking/<backend>.json.
- Backends that cannot purge a step take it once rank 0's resume state covers it (run.resume_every_steps > 0),
  so a relaunch from that state never trains a step they already hold.
"""
from __future__ import annotations

from pathlib import Path

from gyre_hpc.config import GyreConfig, to_dict
from gyre_hpc.tracking.plan import flat_params
from gyre_hpc.tracking.sink import Tracker


def for_run(cfg: GyreConfig, run_dir: Path, saved: dict | None) -> Tracker | None:
    if not cfg.tracking.backends:
        return None
    return Tracker(cfg.tracking, run_dir, params=flat_params(to_dict(cfg)), name=Path(run_dir).name,
                   kept=list(saved["steps"]) if saved else None, hold_steps=cfg.run.resume_every_steps > 0,
                   tags={"policy": cfg.scheduler.policy})


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
