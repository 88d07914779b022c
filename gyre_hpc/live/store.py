"""Where the core leaves each policy version for the others: ``<run_dir>/weights/`` (shared file system).

::

    weights/v000003/        engines' format (engines.weights.save_weights: weights.pt + meta.json), atomic
    weights/LATEST.json     {"version": 3, "path": ".../v000003", "descriptor": {...}}   (atomic rename)

Rollout cells and satellites read its Mooncake ``descriptor`` and pull the core's published buffer; rollout cells then
push it into their engine (``/update_weights_from_distributed``, docs/weights.md). The directories serve export,
checkpoints and ``/update_weights_from_disk`` (an endpoint, off the hot path).

Invariants
- ``LATEST.json`` is written only after the version's directory is complete and its buffer is published, so a
  reader that sees version v can load v.
- Versions only grow; the last ``keep`` directories are kept (older ones are removed by the core).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from gyre_hpc.files.io import atomic_write_json


def weights_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "weights"


def write_latest(run_dir: Path, version: int, path: Path, descriptor: dict | None, keep: int = 3) -> None:
    atomic_write_json(weights_dir(run_dir) / "LATEST.json",
                      {"version": version, "path": str(path), "descriptor": descriptor})
    old = sorted(p for p in weights_dir(run_dir).glob("v*") if p.is_dir())[:-keep]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)


def read_latest(run_dir: Path) -> dict | None:
    """The latest version record, or None before the core wrote one."""
    try:
        return json.loads((weights_dir(run_dir) / "LATEST.json").read_text())
    except FileNotFoundError:
        return None


def version_dir(run_dir: Path, version: int) -> Path:
    return weights_dir(run_dir) / f"v{version:06d}"
