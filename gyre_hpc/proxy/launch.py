"""Start the proxy as its own process and wait until it answers ``/health`` (as ``engines.launch`` does for engines).

Invariants: the proxy process is stopped by its process group only (SIGTERM, SIGKILL after a grace period), and
dies with the process that started it (``engines.children``: parent-death signal, its own watchdog); its config
and log, when the caller names no place for them, live in a scratch directory that ``stop()`` removes.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import yaml

from gyre_hpc.config import GyreConfig, ProxyConfig, to_dict
from gyre_hpc.engines.launch import EngineHandle, scratch_dir, spawn_ready
from gyre_hpc.files.io import atomic_write_text

__all__ = ["start_proxy"]


def start_proxy(cfg: ProxyConfig, engines: Sequence[tuple[int, str]] = (), port: int | None = None,
                log_path: str | Path | None = None, config_dir: str | Path | None = None) -> EngineHandle:
    """Run ``python -m gyre_hpc.proxy.server`` on ``port`` (default ``proxy.port``) with ``(cell, url)`` engines."""
    port = port if port is not None else cfg.port
    scratch = scratch_dir("proxy") if config_dir is None or log_path is None else None
    data = {"proxy": to_dict(GyreConfig(proxy=cfg))["proxy"]}
    config_path = atomic_write_text(Path(config_dir or scratch) / f"proxy-{port}.yaml",
                                    yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "gyre_hpc.proxy.server", "--config", str(config_path), "--port", str(port)]
    cmd += [arg for cell, url in engines for arg in ("--engine", f"{cell}={url}")]
    return spawn_ready(cmd, f"http://{cfg.host}:{port}", Path(log_path) if log_path else None,
                       cfg.startup_timeout_s, "proxy", scratch=scratch)
