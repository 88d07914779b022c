"""The rollout side of a cell (edge: engine processes, the proxy's admin API).

``start()`` launches the cell's engine (``engines.launch.start_engine``) from the newest published weights
(``LATEST.json``; before the first step: the seed's initial weights, which equal the trainer's version 0) and
registers it with the proxy under a fresh name. ``refresh()`` loads a newer version into the running engine
(``/update_weights_from_disk``; requests in flight continue, their tokens after the load carry the new
version). ``leave()`` asks the proxy to drain the cell — its calls move to other engines without the harness
seeing an error — removes it, then stops the engine by PID.

Invariants (tests/integration/test_live_training.py)
- An engine is registered with the proxy only once it is healthy, and removed from the proxy before it stops,
  so the proxy never routes a new call to a stopping engine.
- The engine serves the newest version the core has written (checked at every ``refresh``).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gyre_hpc.cell import store
from gyre_hpc.config import GyreConfig


class RolloutSide:
    def __init__(self, cfg: GyreConfig, run_dir: Path, cell: int, proxy_url: str):
        self.cfg, self.run_dir, self.cell, self.proxy_url = cfg, run_dir, cell, proxy_url
        self.handle = None
        self.client = None
        self.version = -1
        self.starts = 0
        self.updates = 0

    @property
    def running(self) -> bool:
        return self.handle is not None

    def start(self) -> dict:
        """Start and register the engine; returns the timing (engine_start_s, register_s)."""
        from gyre_hpc.engines.launch import start_engine_on_free_port
        from gyre_hpc.proxy.client import ProxyClient

        t0 = time.perf_counter()
        latest = store.read_latest(self.run_dir)
        engine = self.cfg.engine
        if latest is not None:
            engine = dataclasses.replace(engine, model_path=latest["path"],
                                         initial_weight_version=str(latest["version"]))
        self.starts += 1
        logs = self.run_dir / "cells" / f"cell{self.cell}"
        self.handle = start_engine_on_free_port(engine, self.cfg.model, seed=self.cfg.run.seed,
                                                log_path=logs / f"engine-{self.starts}.log")
        self.client = self.handle.client(timeout=engine.request_timeout_s)
        self.version = int(self.client.weight_version())
        t1 = time.perf_counter()
        with ProxyClient(self.proxy_url, timeout=30.0) as proxy:
            proxy.add_engine(self.handle.url, cell=self.cell, name=f"cell{self.cell}-e{self.starts}")
        self.refresh()
        return {"engine_start_s": t1 - t0, "register_s": time.perf_counter() - t1}

    def refresh(self) -> bool:
        """Load a newer published version into the engine; True if one was loaded."""
        latest = store.read_latest(self.run_dir)
        if self.client is None or latest is None or latest["version"] <= self.version:
            return False
        self.client.update_weights_from_disk(latest["path"], str(latest["version"]))
        self.version = latest["version"]
        self.updates += 1
        return True

    def alive(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def leave(self) -> dict:
        """Drain the cell in the proxy, remove it, stop the engine; returns the timing breakdown."""
        from gyre_hpc.proxy.client import ProxyClient

        t0 = time.perf_counter()
        with ProxyClient(self.proxy_url, timeout=self.cfg.proxy.drain_timeout_s + 30.0) as proxy:
            drained = proxy.drain(cell=self.cell)
            proxy.remove(cell=self.cell)
        t1 = time.perf_counter()
        self.stop()
        return {"drain_s": t1 - t0, "engine_stop_s": time.perf_counter() - t1,
                "moved_calls": drained.get("moved", 0)}

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.handle is not None:
            self.handle.stop()
        self.handle = self.client = None
