"""A run directory and the one config file in it: RUN_DIR/config.yaml, the config the run's ranks run with.

::

    gyre train / gyre submit / gyre_hpc.submit   RunDir.new(run.out_dir, run.name)   <out_dir>/<name>-TIMESTAMP[-N]
    gyre sweep (one directory per element)       RunDir.at(OUT / "e000")
    gyre serve                                   RunDir.new(run.out_dir, "serve") or RunDir.at(--tito-dir)
    a rank (live/rank.py)                        RunDir.at(--run-dir); rank 0 keeps the config of a plain sbatch
      └─ write_config(cfg) / keep_config(cfg)   config.yaml (temp file + rename)
      └─ saved_config() / read_config()         the config as written, read back

The config written is the resolved one (``gyre_hpc.models.run_init``: ``model.hf_path`` pointing at
RUN_DIR/model/init when the run has its own initial model); the caller resolves it before writing, and a rank
resolves it once at its entry (``live.rank.run_rank``) and hands it down.

Invariants (tests/unit/test_rundir.py)
- Every entry point creates its run directory and writes RUN_DIR/config.yaml here; nothing else writes config.yaml
  (the launcher of a resumed run writes none: the run's own config.yaml stays as the resume check reads it).
- Atomic: config.yaml is written to a temporary sibling and renamed (``gyre_hpc.files.io.atomic_write_text``): a reader
  never sees half of one, and a failed write leaves the earlier file (or none).
- ``keep_config`` never replaces a config.yaml that is there: a rank started on a run directory another process
  prepared (a launcher, the submitter) leaves the config that was validated before the job started.
- A config that cannot be written is a ``ConfigError`` naming ``run.out_dir``; a directory ``new`` made for it is
  removed first (nothing half-written is left behind).
- ``read_config`` gives back the config written: ``read_config() == cfg`` for the config passed to ``write_config``.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre_hpc.config import GyreConfig, load_config, to_dict
from gyre_hpc.errors import ConfigError
from gyre_hpc.files.io import atomic_write_text, make_run_dir

CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class RunDir:
    """One run's directory. ``fresh``: made by ``new`` for this run (removed again if its config cannot be written)."""

    path: Path
    fresh: bool = False

    @classmethod
    def new(cls, out_dir: str | Path, name: str, absolute: bool = False) -> RunDir:
        """A fresh ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>[-N]`` (``absolute``: resolved); a ``ConfigError`` if it
        cannot be made."""
        path = make_run_dir(out_dir, name)
        return cls(path.resolve() if absolute else path, fresh=True)

    @classmethod
    def at(cls, path: str | Path) -> RunDir:
        """The run directory ``path``, made (with its parents) if it is not there yet."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    def write_config(self, cfg: GyreConfig) -> Path:
        """Write ``cfg`` (resolved) as RUN_DIR/config.yaml, atomically; its path."""
        try:
            return atomic_write_text(self.config_path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
        except OSError as exc:
            self.discard_if_fresh()
            raise ConfigError(f"run.out_dir: cannot write {self.config_path} ({exc.strerror or exc}); "
                              f"free space or choose another directory with --set run.out_dir=DIR") from None

    def discard_if_fresh(self) -> None:
        """Remove the directory if ``new`` made it for this run (a start that failed leaves nothing half-written)."""
        if self.fresh:
            shutil.rmtree(self.path, ignore_errors=True)

    def keep_config(self, cfg: GyreConfig) -> Path:
        """RUN_DIR/config.yaml as it is, or ``cfg`` written there when there is none (ranks srun started from a
        plain sbatch script: the config the resume check compares against)."""
        return self.config_path if self.config_path.is_file() else self.write_config(cfg)

    def saved_config(self) -> dict[str, Any] | None:
        """The config written in RUN_DIR/config.yaml as plain YAML data; None when there is none."""
        if not self.config_path.is_file():
            return None
        return yaml.safe_load(self.config_path.read_text()) or {}

    def read_config(self) -> GyreConfig:
        """The config written in RUN_DIR/config.yaml, loaded with the strict checks of ``load_config``."""
        if not self.config_path.is_file():
            raise ConfigError(f"{self.config_path}: no config in this run directory (a run writes it when it starts)")
        return load_config(self.config_path)
