"""The rollout side of a cell (edge: engine processes, the proxy's admin API).

A cell serves ``replicas.replicas_per_cell`` engine replicas (``live.engine_replica.EngineReplica``: one server
process each, ``engine.tp`` GPUs each, its own port and proxy name); with one, everything below is exactly the
single-engine behaviour. Every step below applies to each replica: ``start()`` starts (or wakes) every replica
that does not serve, side by side, and registers each once it is on the newest version; ``refresh()`` pulls a new
version once and pushes it into every replica; ``leave()`` drains all the cell's replicas in one proxy call (their
calls move to other cells' engines, never to a sibling that is leaving too) and stops or puts each to sleep;
``reap()`` takes out one dead replica and ``start()`` then restarts it alone, its siblings serving meanwhile.

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

Invariants (tests/integration/test_live_training.py; several replicas: tests/integration/test_live_replicas.py)
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

import concurrent.futures
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from gyre_hpc.live import store
from gyre_hpc.clock import Clock, WallClock, wait_until
from gyre_hpc.config import EngineConfig, ModelConfig, ProxyConfig, TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.live.engine_replica import EngineReplica
from gyre_hpc.replicas import ReplicaSpec

T = TypeVar("T")

PULL_GIVE_UP_S = 60.0  # a rollout cell whose pulls of a published version fail this long raises (TransferError)
MOVES_WAIT_S = 5.0  # how long reap() waits for the proxy to log the moves of the dead engine's calls


class RolloutSide:
    def __init__(self, run_dir: Path, cell: int, proxy_url: str, *, engine: EngineConfig, model: ModelConfig,
                 transfer: TransferConfig, proxy: ProxyConfig, seed: int, clock: Clock | None = None,
                 replicas: Sequence[ReplicaSpec] = (ReplicaSpec(0),)):
        """``replicas``: the engine replicas this process serves for the cell (``replicas.replica_specs``)."""
        self.run_dir, self.cell, self.proxy_url = run_dir, cell, proxy_url
        self.engine, self.model, self.transfer, self.proxy, self.seed = engine, model, transfer, proxy, seed
        self.clock = clock or WallClock()  # timings, the pull give-up window, death stamps
        self.replicas = [EngineReplica(spec, cell, len(replicas), run_dir, engine=engine, model=model, seed=seed,
                                       push_timeout_s=transfer.timeout_s * 2.0, clock=self.clock)
                         for spec in replicas]
        self.updates = 0  # versions pushed into engines (one per replica and version)
        self.deaths: list[dict] = []
        self.puller = None  # the transfer backend's puller, made at the first refresh (after any fork)
        self.syncs: list[dict] = []  # one record per version pushed into a replica: pull and push timings
        self.pull_errors: list[dict] = []  # failed pulls (retried at the next refresh)
        self._failing: float | None = None

    @property
    def running(self) -> bool:
        """An engine serves (or should: a dead one is found by ``dead()``); a sleeping one does not."""
        return any(r.running for r in self.replicas)

    @property
    def starts(self) -> int:
        """Engine processes started, over every replica."""
        return sum(r.starts for r in self.replicas)

    @property
    def wakes(self) -> int:
        return sum(r.wakes for r in self.replicas)

    def start(self) -> dict:
        """Start (or wake) every replica that does not serve, bring each to the newest version, then register it;
        returns the timing (engine_start_s or engine_wake_s, register_s)."""
        todo = [r for r in self.replicas if not r.running]
        t0 = self.clock.now()
        kinds = _each(self._bring_up, todo)
        self.refresh()  # the newest version, by the one road, before the proxy sees the engines
        t1 = self.clock.now()
        for r in todo:
            r.register(self.proxy_url)
        part = "engine_wake_s" if kinds and all(k == "wake" for k in kinds) else "engine_start_s"
        return {part: t1 - t0, "register_s": self.clock.now() - t1}

    @staticmethod
    def _bring_up(replica: EngineReplica) -> str:
        """Wake a sleeping replica ("wake"); start one that is stopped or died in its sleep ("start")."""
        if replica.asleep:
            if replica.alive():
                replica.wake()
                return "wake"
            replica.stop()
        replica.launch()
        return "start"

    def refresh(self) -> bool:
        """Bring a newer published version into every serving replica below it (one pull, then a push to each);
        True if one was loaded."""
        latest = store.read_latest(self.run_dir)
        if latest is None:
            return False
        behind = [r for r in self.replicas if r.client is not None and not r.asleep and r.version < latest["version"]]
        if not behind:
            return False
        try:
            tensors, rec = self._pull(latest)
        except TransferError as exc:  # e.g. the core closed its buffer as the run ends: try again next pass
            self.pull_errors.append({"version": latest["version"], "error": str(exc)[:300], "t": self.clock.wall()})
            if self.clock.now() - self._failing_since(True) > PULL_GIVE_UP_S:
                raise
            return False
        self._failing_since(False)
        loaded = False
        for r in behind:
            t0 = self.clock.now()
            pushed = r.push(tensors, rec["version"])
            if pushed is None:
                continue  # it died: the restart starts on the newest weights
            self.syncs.append({**rec, "replica": r.index, "push_s": self.clock.now() - t0,
                               "push_gb_per_s": pushed["gb_per_s"], "push_attempts": pushed["attempt"] + 1})
            self.updates += 1
            loaded = True
        return loaded

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
        """Every replica's engine process lives (a sleeping one counts)."""
        return all(r.alive() for r in self.replicas)

    def served_version(self):
        """The weight_version the engines' ``/model_info`` show now: one value when the live replicas agree (or
        there is one), the list of each replica's otherwise; None without a live engine."""
        versions = [v for r in self.replicas if (v := r.served_version()) is not None]
        if not versions:
            return None
        return versions[0] if len(set(versions)) == 1 else versions

    def dead(self) -> bool:
        """True when a replica has an engine whose process exited without being stopped."""
        return any(r.dead() for r in self.replicas)

    def reap(self) -> dict:
        """Take one dead replica's engine out of the proxy; returns {pid, exit_code, engine, calls_moved,
        runs_moved} (``deaths[-1]`` also names the replica); ``start()`` then starts that replica alone."""
        from gyre_hpc.proxy.client import ProxyClient

        replica = next(r for r in self.replicas if r.dead())
        pid, code, name = replica.handle.pid, replica.handle.process.returncode, replica.name
        replica.stop()
        with ProxyClient(self.proxy_url, timeout=self.proxy.drain_timeout_s + 30.0) as proxy:
            proxy.mark_dead(engine=name, reason=f"engine process {pid} exited with {code}")  # no-op if it knew
            proxy.remove(engine=name)
            moves = _moves_of(proxy, name, self.clock)
        rec = {"pid": pid, "exit_code": code, "engine": name, "calls_moved": len(moves),
               "runs_moved": len({m["run_id"] for m in moves})}
        self.deaths.append({**rec, "replica": replica.index, "t": self.clock.wall()})
        return rec

    def leave(self) -> dict:
        """Drain the cell in the proxy (every replica: their calls move to other cells' engines), remove its
        engines, then stop (or put to sleep) every replica; returns the timing breakdown."""
        from gyre_hpc.proxy.client import ProxyClient

        t0 = self.clock.now()
        with ProxyClient(self.proxy_url, timeout=self.proxy.drain_timeout_s + 30.0) as proxy:
            drained = proxy.drain(cell=self.cell)
            proxy.remove(cell=self.cell)
        t1 = self.clock.now()
        kinds = _each(self._put_down, [r for r in self.replicas if r.running])
        part = "engine_stop_s" if "stop" in kinds or not kinds else "engine_sleep_s"
        return {"drain_s": t1 - t0, part: self.clock.now() - t1, "moved_calls": drained.get("moved", 0)}

    def _put_down(self, replica: EngineReplica) -> str:
        if self.engine.sleep_in_training and replica.alive():
            replica.sleep()
            return "sleep"
        replica.stop()
        return "stop"

    def stop(self) -> None:
        _each(EngineReplica.stop, self.replicas)

    def close(self) -> None:
        """Stop the engines and free the puller (end of the run)."""
        self.stop()
        if self.puller is not None:
            self.puller.close()
            self.puller = None


def _each(fn: Callable[[EngineReplica], T], replicas: list[EngineReplica]) -> list[T]:
    """``fn`` on every replica: side by side in threads when there are several (engine starts and stops take
    seconds each), inline for one; the first failure raises once all have finished."""
    if len(replicas) <= 1:
        return [fn(r) for r in replicas]
    with concurrent.futures.ThreadPoolExecutor(len(replicas)) as pool:
        futures = [pool.submit(fn, r) for r in replicas]
    return [f.result() for f in futures]


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
