"""The rollout side of a cell (edge: engine processes, the proxy's admin API).

``start()`` launches the cell's engine (``engines.launch.start_engine``) on its initial weights (the seed's, or
``model.hf_path``'s: the trainer's version 0), brings it to the newest published version (``refresh``), then
registers it with the proxy under a fresh name. ``refresh()`` brings a newer version into the running engine
by the one road (docs/weights.md): it pulls the core's published buffer over the transfer backend (Mooncake,
checksums verified: what satellites do), then pushes the tensors into its engine over
``/update_weights_from_distributed`` (``engines.weight_sync.WeightPusher``, the same calls for the local engine
and SGLang; ``engine.weight_road: tensor``: over ``/update_weights_from_tensor``, ``engines.weight_tensor``); requests in flight continue, their tokens after the load carry the new version. The engine reads
the disk only for its initial weights when it starts or wakes (then the newest version is pushed again).
``leave()`` asks the proxy to drain the cell — its calls move to other engines without the harness seeing an
error — removes it, then stops the engine by PID, or with ``engine.sleep_in_training`` puts it to
sleep (``/release_memory_occupation``: the process stays, its memory goes; on CPU SGLang keeps it); ``start()`` then wakes it
(``/resume_memory_occupation``), loads the newest weights and registers it again under a fresh name — no
process start.

An engine that exits on its own (crash, OOM kill, SIGKILL) is found by ``dead()`` (the runner polls the Popen
in every pass); ``reap()`` marks it dead in the proxy — which resubmits its calls elsewhere from the tokens kept
before (often it has already noticed the broken connections itself) —, removes it, and returns the proxy's
``move`` records for it; the runner then ``start()``s a new engine on the newest weights.

Invariants (tests/integration/test_live_training.py)
- An engine is registered with the proxy only once it is healthy and serves the newest version, and removed
  from the proxy before it stops or sleeps, so the proxy never routes a new call to a stopping or sleeping engine; a woken engine is
  registered only after it loaded the newest weights.
- The engine serves the newest version the core has written (checked at every ``refresh``); a refresh never
  reads the weights directory (pull + push only) and never aborts a request.
- A dead engine is removed from the proxy before a new one is registered; a refresh that fails because the
  engine just died is left to the restart, which loads the newest version anyway
  (tests/integration/test_live_faults.py).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from gyre_hpc.live import store
from gyre_hpc.clock import Clock, WallClock, wait_until
from gyre_hpc.live.engine_weights import start_model_dir
from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig, TransferConfig
from gyre_hpc.errors import EngineError, TransferError

PULL_GIVE_UP_S = 60.0  # a rollout cell whose pulls of a published version fail this long raises (TransferError)
MOVES_WAIT_S = 5.0  # how long reap() waits for the proxy to log the moves of the dead engine's calls


class RolloutSide:
    def __init__(self, run_dir: Path, cell: int, proxy_url: str, *, engine: EngineConfig, model: ModelConfig,
                 transfer: TransferConfig, proxy: ProxyConfig, seed: int, clock: Clock | None = None):
        self.run_dir, self.cell, self.proxy_url = run_dir, cell, proxy_url
        self.engine, self.model, self.transfer, self.proxy, self.seed = engine, model, transfer, proxy, seed
        self.clock = clock or WallClock()  # timings, the pull give-up window, death stamps
        self.handle = None
        self.client = None
        self.version = -1
        self.starts = 0
        self.updates = 0
        self.name = ""
        self.deaths: list[dict] = []
        self.asleep = False
        self.wakes = 0
        self.puller = None  # the transfer backend's puller, made at the first refresh (after any fork)
        self.pusher = None  # engines.weight_sync.WeightPusher of the running engine
        self.syncs: list[dict] = []  # one record per version pushed: pull and push timings
        self.pull_errors: list[dict] = []  # failed pulls (retried at the next refresh)
        self._failing: float | None = None

    @property
    def running(self) -> bool:
        """An engine serves (or should: a dead one is found by ``dead()``); a sleeping one does not."""
        return self.handle is not None and not self.asleep

    def start(self) -> dict:
        """Start and register the engine; returns the timing (engine_start_s, register_s)."""
        from gyre_hpc.engines.launch import start_engine_on_free_port

        if self.asleep:
            return self._wake()
        t0 = self.clock.now()
        # its initial weights (the seed's, or model.hf_path's: version 0); SGLang serves an HF directory
        engine = dataclasses.replace(self.engine, model_path=start_model_dir(self.engine, self.model))
        self.starts += 1
        logs = self.run_dir / "cells" / f"cell{self.cell}"
        self.handle = start_engine_on_free_port(engine, self.model, seed=self.seed,
                                                log_path=logs / f"engine-{self.starts}.log", name=f"cell{self.cell}",
                                                config_dir=logs)
        self.client = self.handle.client(timeout=engine.request_timeout_s)
        self.pusher = self._pusher()
        self.version = int(self.client.weight_version())
        self.refresh()  # the newest version, by the one road, before the proxy sees the engine
        t1 = self.clock.now()
        self._register(f"cell{self.cell}-e{self.starts}")
        return {"engine_start_s": t1 - t0, "register_s": self.clock.now() - t1}

    def _wake(self) -> dict:
        """Wake the sleeping engine, load the newest weights, register it; returns the timing."""
        self.asleep = False
        if not self.alive():  # it died in its sleep: a fresh start instead
            self.stop()
            return self.start()
        t0 = self.clock.now()
        self.client.resume_memory()
        self.version = int(self.client.weight_version())  # back to the disk weights' version if they were pushed
        self.refresh()
        t1 = self.clock.now()
        self.wakes += 1
        self._register(f"cell{self.cell}-e{self.starts}w{self.wakes}")
        return {"engine_wake_s": t1 - t0, "register_s": self.clock.now() - t1}

    def _register(self, name: str) -> None:
        """Add the engine to the proxy under ``name`` (a fresh one per start or wake)."""
        from gyre_hpc.proxy.client import ProxyClient

        self.name = name
        with ProxyClient(self.proxy_url, timeout=30.0) as proxy:
            proxy.add_engine(self.handle.url, cell=self.cell, name=name)

    def _pusher(self):
        from gyre_hpc.engines.weight_tensor import make_pusher

        return make_pusher(self.engine, self.client, timeout_s=self.transfer.timeout_s * 2.0, clock=self.clock)

    def refresh(self) -> bool:
        """Bring a newer published version into the engine (pull, then push); True if one was loaded."""
        latest = store.read_latest(self.run_dir)
        if self.client is None or latest is None or latest["version"] <= self.version:
            return False
        try:
            tensors, rec = self._pull(latest)
        except TransferError as exc:  # e.g. the core closed its buffer as the run ends: try again next pass
            self.pull_errors.append({"version": latest["version"], "error": str(exc)[:300], "t": self.clock.wall()})
            if self.clock.now() - self._failing_since(True) > PULL_GIVE_UP_S:
                raise
            return False
        self._failing_since(False)
        try:
            t0 = self.clock.now()
            pushed = self.pusher.push(tensors, str(rec["version"]))
        except EngineError:
            if self.alive():
                raise
            return False  # it died: the restart starts on the newest weights
        self.syncs.append({**rec, "push_s": self.clock.now() - t0, "push_gb_per_s": pushed["gb_per_s"],
                           "push_attempts": pushed["attempt"] + 1})
        self.version = rec["version"]
        self.updates += 1
        return True

    def _failing_since(self, failing: bool) -> float:
        """When the current run of failed pulls began (reset by a good pull)."""
        self._failing = (self._failing or self.clock.now()) if failing else None
        return self._failing or self.clock.now()

    def _pull(self, latest: dict) -> tuple[dict, dict]:
        """The core's published tensors of ``latest`` (or of a newer version published meanwhile), under the
        names engines load; a checksum mismatch is pulled again up to ``transfer.checksum_retries`` times."""
        import numpy as np
        import torch

        from gyre_hpc.live.training_side import is_checksum_error
        from gyre_hpc.engines.weight_sync import engine_tensors
        from gyre_hpc.transfer import WeightDescriptor, make_puller

        if self.puller is None:
            self.puller = make_puller(self.transfer)
        bad, t0 = 0, self.clock.now()
        while True:
            if not latest.get("descriptor"):
                raise TransferError(f"version {latest['version']} has no transfer descriptor in LATEST.json")
            try:
                arrays, stats = self.puller.pull(WeightDescriptor.from_dict(latest["descriptor"]))
                break
            except TransferError as exc:
                if is_checksum_error(exc) and bad < self.transfer.checksum_retries:
                    bad += 1
                elif "stale" not in str(exc):
                    raise
                latest = store.read_latest(self.run_dir)  # stale: the core published a newer version meanwhile
        full = {k: torch.from_numpy(a if a.flags.writeable else np.array(a)) for k, a in arrays.items()}
        rec = {"version": int(latest["version"]), "pull_s": self.clock.now() - t0, "bytes": stats.bytes,
               "pull_gb_per_s": stats.gb_per_s, "checksum_ok": stats.checksum_ok, "backend": stats.backend,
               "pull_retries": bad}
        return engine_tensors(full, self.model), rec

    def alive(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def served_version(self) -> str | None:
        """The weight_version the engine's ``/model_info`` shows now (asleep or not); None without a live engine."""
        if not self.alive():
            return None
        try:  # a short timeout: a hung engine must not hold up the cell's shutdown
            with self.handle.client(timeout=10.0, connect_retries=0) as client:
                return client.weight_version()
        except EngineError:
            return None

    def dead(self) -> bool:
        """True when the cell has an engine whose process exited without being stopped."""
        return self.handle is not None and not self.handle.alive()

    def reap(self) -> dict:
        """Take the dead engine out of the proxy; returns {pid, exit_code, engine, calls_moved, runs_moved}."""
        from gyre_hpc.proxy.client import ProxyClient

        pid, code, name = self.handle.pid, self.handle.process.returncode, self.name
        self.stop()
        with ProxyClient(self.proxy_url, timeout=self.proxy.drain_timeout_s + 30.0) as proxy:
            proxy.mark_dead(engine=name, reason=f"engine process {pid} exited with {code}")  # no-op if it knew
            proxy.remove(engine=name)
            moves = _moves_of(proxy, name, self.clock)
        rec = {"pid": pid, "exit_code": code, "engine": name, "calls_moved": len(moves),
               "runs_moved": len({m["run_id"] for m in moves})}
        self.deaths.append({**rec, "t": self.clock.wall()})
        return rec

    def leave(self) -> dict:
        """Drain the cell in the proxy, remove it, stop the engine; returns the timing breakdown."""
        from gyre_hpc.proxy.client import ProxyClient

        t0 = self.clock.now()
        with ProxyClient(self.proxy_url, timeout=self.proxy.drain_timeout_s + 30.0) as proxy:
            drained = proxy.drain(cell=self.cell)
            proxy.remove(cell=self.cell)
        t1 = self.clock.now()
        if self.engine.sleep_in_training and self.alive():
            self.client.release_memory()
            self.asleep = True
            part = "engine_sleep_s"
        else:
            self.stop()
            part = "engine_stop_s"
        return {"drain_s": t1 - t0, part: self.clock.now() - t1, "moved_calls": drained.get("moved", 0)}

    def stop(self) -> None:
        if self.pusher is not None:
            self.pusher.reset(remote=self.alive())  # a dead engine's side of the group went with it
            self.pusher = None
        if self.client is not None:
            self.client.close()
        if self.handle is not None:
            self.handle.stop()
        self.handle = self.client = None
        self.asleep = False

    def close(self) -> None:
        """Stop the engine and free the puller (end of the run)."""
        self.stop()
        if self.puller is not None:
            self.puller.close()
            self.puller = None


def _moves_of(proxy, name: str, clock: Clock) -> list[dict]:
    """The proxy's ``move`` records of calls that left the dead engine ``name``, once all it had in flight moved
    (or after MOVES_WAIT_S: a call still waiting for an engine is logged later)."""
    moves: list[dict] = []

    def all_moved() -> bool:
        events = proxy.events()
        dead = [e for e in events if e["event"] == "engine_dead" and e["engine"] == name]
        moves[:] = [e for e in events if e["event"] == "move" and e["from_engine"] == name and e["reason"] == "dead"]
        return len(moves) >= sum(e["in_flight"] for e in dead)

    wait_until(all_moved, MOVES_WAIT_S, clock, poll_s=0.05)
    return moves
