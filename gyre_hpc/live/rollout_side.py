"""The rollout side of a cell (edge: engine processes, the proxy's admin API).

``start()`` launches the cell's engine (``engines.launch.start_engine``) from the newest published weights
(``LATEST.json``; before the first step: the seed's initial weights, which equal the trainer's version 0) and
registers it with the proxy under a fresh name. ``refresh()`` loads a newer version into the running engine
(``/update_weights_from_disk``; requests in flight continue, their tokens after the load carry the new
version). ``leave()`` asks the proxy to drain the cell — its calls move to other engines without the harness
seeing an error — removes it, then stops the engine by PID, or with ``engine.sleep_in_training`` puts it to
sleep (``/release_memory_occupation``: the process stays, its memory goes); ``start()`` then wakes it
(``/resume_memory_occupation``), loads the newest weights and registers it again under a fresh name — no
process start.

An engine that exits on its own (crash, OOM kill, SIGKILL) is found by ``dead()`` (the runner polls the Popen
in every pass); ``reap()`` marks it dead in the proxy — which resubmits its calls elsewhere from the tokens kept
before (often it has already noticed the broken connections itself) —, removes it, and returns the proxy's
``move`` records for it; the runner then ``start()``s a new engine on the newest weights.

Invariants (tests/integration/test_live_training.py)
- An engine is registered with the proxy only once it is healthy, and removed from the proxy before it stops
  or sleeps, so the proxy never routes a new call to a stopping or sleeping engine; a woken engine is
  registered only after it loaded the newest weights.
- The engine serves the newest version the core has written (checked at every ``refresh``).
- A dead engine is removed from the proxy before a new one is registered; a refresh that fails because the
  engine just died is left to the restart, which loads the newest version anyway
  (tests/integration/test_live_faults.py).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gyre_hpc.live import store
from gyre_hpc.config import GyreConfig
from gyre_hpc.errors import EngineError

MOVES_WAIT_S = 5.0  # how long reap() waits for the proxy to log the moves of the dead engine's calls


class RolloutSide:
    def __init__(self, cfg: GyreConfig, run_dir: Path, cell: int, proxy_url: str):
        self.cfg, self.run_dir, self.cell, self.proxy_url = cfg, run_dir, cell, proxy_url
        self.handle = None
        self.client = None
        self.version = -1
        self.starts = 0
        self.updates = 0
        self.name = ""
        self.deaths: list[dict] = []
        self.asleep = False
        self.wakes = 0

    @property
    def running(self) -> bool:
        """An engine serves (or should: a dead one is found by ``dead()``); a sleeping one does not."""
        return self.handle is not None and not self.asleep

    def start(self) -> dict:
        """Start and register the engine; returns the timing (engine_start_s, register_s)."""
        from gyre_hpc.engines.launch import start_engine_on_free_port

        if self.asleep:
            return self._wake()
        t0 = time.perf_counter()
        latest = store.read_latest(self.run_dir)
        engine = self.cfg.engine
        if latest is not None:
            engine = dataclasses.replace(engine, model_path=latest["path"],
                                         initial_weight_version=str(latest["version"]))
        self.starts += 1
        logs = self.run_dir / "cells" / f"cell{self.cell}"
        self.handle = start_engine_on_free_port(engine, self.cfg.model, seed=self.cfg.run.seed,
                                                log_path=logs / f"engine-{self.starts}.log", name=f"cell{self.cell}")
        self.client = self.handle.client(timeout=engine.request_timeout_s)
        self.version = int(self.client.weight_version())
        t1 = time.perf_counter()
        self._register(f"cell{self.cell}-e{self.starts}")
        self.refresh()
        return {"engine_start_s": t1 - t0, "register_s": time.perf_counter() - t1}

    def _wake(self) -> dict:
        """Wake the sleeping engine, load the newest weights, register it; returns the timing."""
        self.asleep = False
        if not self.alive():  # it died in its sleep: a fresh start instead
            self.stop()
            return self.start()
        t0 = time.perf_counter()
        self.client.resume_memory()
        self.refresh()
        t1 = time.perf_counter()
        self.wakes += 1
        self._register(f"cell{self.cell}-e{self.starts}w{self.wakes}")
        return {"engine_wake_s": t1 - t0, "register_s": time.perf_counter() - t1}

    def _register(self, name: str) -> None:
        """Add the engine to the proxy under ``name`` (a fresh one per start or wake)."""
        from gyre_hpc.proxy.client import ProxyClient

        self.name = name
        with ProxyClient(self.proxy_url, timeout=30.0) as proxy:
            proxy.add_engine(self.handle.url, cell=self.cell, name=name)

    def refresh(self) -> bool:
        """Load a newer published version into the engine; True if one was loaded."""
        latest = store.read_latest(self.run_dir)
        if self.client is None or latest is None or latest["version"] <= self.version:
            return False
        try:
            self.client.update_weights_from_disk(latest["path"], str(latest["version"]))
        except EngineError:
            if self.alive():
                raise
            return False  # it died: the restart starts on the newest weights
        self.version = latest["version"]
        self.updates += 1
        return True

    def alive(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def dead(self) -> bool:
        """True when the cell has an engine whose process exited without being stopped."""
        return self.handle is not None and not self.handle.alive()

    def reap(self) -> dict:
        """Take the dead engine out of the proxy; returns {pid, exit_code, engine, calls_moved, runs_moved}."""
        from gyre_hpc.proxy.client import ProxyClient

        pid, code, name = self.handle.pid, self.handle.process.returncode, self.name
        self.stop()
        with ProxyClient(self.proxy_url, timeout=self.cfg.proxy.drain_timeout_s + 30.0) as proxy:
            proxy.mark_dead(engine=name, reason=f"engine process {pid} exited with {code}")  # no-op if it knew
            proxy.remove(engine=name)
            moves = _moves_of(proxy, name)
        rec = {"pid": pid, "exit_code": code, "engine": name, "calls_moved": len(moves),
               "runs_moved": len({m["run_id"] for m in moves})}
        self.deaths.append({**rec, "t": time.time()})
        return rec

    def leave(self) -> dict:
        """Drain the cell in the proxy, remove it, stop the engine; returns the timing breakdown."""
        from gyre_hpc.proxy.client import ProxyClient

        t0 = time.perf_counter()
        with ProxyClient(self.proxy_url, timeout=self.cfg.proxy.drain_timeout_s + 30.0) as proxy:
            drained = proxy.drain(cell=self.cell)
            proxy.remove(cell=self.cell)
        t1 = time.perf_counter()
        if self.cfg.engine.sleep_in_training and self.alive():
            self.client.release_memory()
            self.asleep = True
            part = "engine_sleep_s"
        else:
            self.stop()
            part = "engine_stop_s"
        return {"drain_s": t1 - t0, part: time.perf_counter() - t1, "moved_calls": drained.get("moved", 0)}

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.handle is not None:
            self.handle.stop()
        self.handle = self.client = None
        self.asleep = False


def _moves_of(proxy, name: str) -> list[dict]:
    """The proxy's ``move`` records of calls that left the dead engine ``name``, once all it had in flight moved
    (or after MOVES_WAIT_S: a call still waiting for an engine is logged later)."""
    deadline = time.monotonic() + MOVES_WAIT_S
    while True:
        events = proxy.events()
        dead = [e for e in events if e["event"] == "engine_dead" and e["engine"] == name]
        moves = [e for e in events if e["event"] == "move" and e["from_engine"] == name and e["reason"] == "dead"]
        if len(moves) >= sum(e["in_flight"] for e in dead) or time.monotonic() > deadline:
            return moves
        time.sleep(0.05)
