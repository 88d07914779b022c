"""A sweep as one comparison in the trackers (edge): one tracked run per grid point, grouped.

::

    gyre sweep ... --out OUT  (live or --simulate), once every element ended:
      tensorboard  OUT/tensorboard/e000, e001, ...      (tensorboard --logdir OUT/tensorboard)
      wandb        OUT/wandb/offline-run-*, group = OUT's name, tags key=value per grid axis
      mlflow       experiment tracking.project; the parent run "OUT's name", one child run per element
                   (tag mlflow.parentRunId); store OUT/mlruns or tracking.mlflow_uri
    each element's run: params = its grid values, tags = its grid values and status, metrics = the numbers of its
    result row (summary/<column> at step 1). A live element's own run directory (OUT/e000) is tracked by the run itself as well.

Invariants (tests/integration/test_tracking_sweep.py)
- One tracked run per element, every one in the same group / under the same parent; a failed element is tracked
  too, with its status tag.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from gyre_hpc.config import TrackingConfig
from gyre_hpc.tracking import backends as B
from gyre_hpc.tracking.sink import Tracker, read_state


def track_sweep(cfg: TrackingConfig, out: Path, axes: Sequence[str], rows: Sequence[Mapping],
                timeout_s: float | None = None) -> list:
    """Log each result row as a grouped tracked run; returns the ``tracking_error`` records (never raises)."""
    if not cfg.backends:
        return []
    out = Path(out)
    group = out.name
    parent = _mlflow_parent(cfg, out, group) if "mlflow" in cfg.backends else None
    errors: list = []
    for row in rows:
        name = f"e{int(row['element']):03d}"
        grid = {k: row.get(k) for k in axes}
        t = Tracker(cfg, out, params={**grid}, name=f"{group}-{name}", group=group,
                    tags={**{k: str(v) for k, v in grid.items()}, "status": row.get("status", ""), "sweep": group},
                    parent=parent, tb_dir=out / "tensorboard" / name, state_dir=out / "tracking" / name)
        t.finish({k: v for k, v in row.items() if k not in axes}, 1)
        t.close(timeout=timeout_s)
        errors += t.take_errors()
    return errors


def _mlflow_parent(cfg: TrackingConfig, out: Path, group: str) -> str | None:
    """The sweep's parent run (created once; its id kept in OUT/tracking/parent/mlflow.json)."""
    state_dir = out / "tracking" / "parent"
    state = read_state(state_dir, "mlflow")
    try:
        b = B.make("mlflow", out, project=cfg.project, name=group, mlflow_uri=cfg.mlflow_uri, tags={"sweep": group})
        state.update(b.open(state))
        from gyre_hpc.files.io import atomic_write_json

        atomic_write_json(state_dir / "mlflow.json", state)
        b.close(finished=True)
        return state["run_id"]
    except Exception:  # noqa: BLE001  (never fatal: the children are still tracked, without a parent)
        return None
