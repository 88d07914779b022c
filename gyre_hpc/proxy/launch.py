"""Start the proxy as its own process and wait until it answers ``/health`` (as ``engines.launch`` does for engines).

Invariant: the proxy process is stopped by its process group only (SIGTERM, SIGKILL after a grace period), and
dies with the process that started it (``engines.children``: parent-death signal, its own watchdog).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import yaml

from gyre_hpc.config import GyreConfig, ProxyConfig, to_dict
from gyre_hpc.engines.launch import EngineHandle as ProcessHandle
from gyre_hpc.engines import children
from gyre_hpc.io import atomic_write_text

__all__ = ["ProcessHandle", "start_proxy"]


def start_proxy(cfg: ProxyConfig, engines: Sequence[tuple[int, str]] = (), port: int | None = None,
                log_path: str | Path | None = None, config_dir: str | Path | None = None) -> ProcessHandle:
    """Run ``python -m gyre_hpc.proxy.server`` on ``port`` (default ``proxy.port``) with ``(cell, url)`` engines."""
    port = port if port is not None else cfg.port
    config_dir = Path(config_dir) if config_dir is not None else Path(tempfile.mkdtemp(prefix="gyre-proxy-"))
    data = {"proxy": to_dict(GyreConfig(proxy=cfg))["proxy"]}
    config_path = atomic_write_text(config_dir / f"proxy-{port}.yaml", yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "gyre_hpc.proxy.server", "--config", str(config_path), "--port", str(port)]
    cmd += [arg for cell, url in engines for arg in ("--engine", f"{cell}={url}")]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="gyre-proxy-", suffix=".log")
        log_path = name
        os.close(fd)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = children.spawn(cmd, log, children.child_env())
    handle = ProcessHandle(f"http://{cfg.host}:{port}", proc, log_path)
    handle.wait_ready(cfg.startup_timeout_s)
    return handle
