"""One engine replica of a rollout cell (edge: an engine process, its client and weight pusher, the proxy's admin API).

A rollout cell serves ``replicas.replicas_per_cell`` of these (``live.rollout_side.RolloutSide`` drives them): each
is its own server process (``engines.launch.start_engine_on_free_port``: a port of its own, and on GPUs its own
``CUDA_VISIBLE_DEVICES`` slice, ``replicas.ReplicaSpec``), registered with the proxy under its own name
(``replicas.replica_name``), with its own served version. ``launch`` is "start replica r with spec S": any process
of the cell can call it.

Invariants (tests/integration/test_live_replicas.py; the single-replica ones: tests/integration/test_live_training.py)
- ``register`` is called only by the rollout side once the replica is healthy and on the newest version; each
  start or wake registers under a fresh name, so the proxy never confuses two processes of one replica.
- ``stop`` resets the weight pusher (the engine's side of its group only while the engine lives), closes the
  client, ends the process group and forgets the handle: ``dead()`` is then False, ``running`` False.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gyre_hpc.clock import Clock
from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.errors import EngineError
from gyre_hpc.live.engine_weights import start_model_dir
from gyre_hpc.replicas import ReplicaSpec, replica_name


class EngineReplica:
    def __init__(self, spec: ReplicaSpec, cell: int, replicas: int, run_dir: Path, *, engine: EngineConfig,
                 model: ModelConfig, seed: int, push_timeout_s: float, clock: Clock):
        self.spec, self.cell, self.replicas, self.run_dir = spec, cell, replicas, run_dir
        self.engine, self.model, self.seed, self.push_timeout_s, self.clock = engine, model, seed, push_timeout_s, clock
        self.handle = None
        self.client = None
        self.pusher = None  # engines.weight_sync.WeightPusher (or weight_tensor's) of the running engine
        self.version = -1  # the version the engine serves (its disk weights' until a push)
        self.starts = 0
        self.wakes = 0
        self.name = ""
        self.asleep = False

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def running(self) -> bool:
        """The engine serves (or should: a dead one is found by ``dead()``); a sleeping one does not."""
        return self.handle is not None and not self.asleep

    def launch(self) -> None:
        """Start the engine process on its initial weights (the seed's, or model.hf_path's: version 0)."""
        from gyre_hpc.engines.launch import start_engine_on_free_port

        engine = dataclasses.replace(self.engine, model_path=start_model_dir(self.engine, self.model))
        self.starts += 1
        logs = self.run_dir / "cells" / f"cell{self.cell}"
        log = f"engine-{self.starts}.log" if self.replicas == 1 else f"engine-r{self.index}-{self.starts}.log"
        name = f"cell{self.cell}" if self.replicas == 1 else f"cell{self.cell} replica {self.index}"
        self.handle = start_engine_on_free_port(engine, self.model, seed=self.seed, log_path=logs / log, name=name,
                                                config_dir=logs,
                                                devices=self.spec.visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")))
        self.client = self.handle.client(timeout=engine.request_timeout_s)
        self.pusher = self._pusher()
        self.version = int(self.client.weight_version())

    def wake(self) -> None:
        """Give the sleeping engine its memory back (``/resume_memory_occupation``); its version is the disk's again
        if weights were pushed (the caller pushes the newest)."""
        self.asleep = False
        self.client.resume_memory()
        self.version = int(self.client.weight_version())
        self.wakes += 1

    def sleep(self) -> None:
        self.client.release_memory()
        self.asleep = True

    def register(self, proxy_url: str) -> None:
        """Add the engine to the proxy under a fresh name (one per start or wake)."""
        from gyre_hpc.proxy.client import ProxyClient

        self.name = replica_name(self.cell, self.index, self.replicas, self.starts, self.wakes)
        with ProxyClient(proxy_url, timeout=30.0) as proxy:
            proxy.add_engine(self.handle.url, cell=self.cell, name=self.name)

    def _pusher(self):
        from gyre_hpc.engines.weight_tensor import make_pusher

        from gyre_hpc.engines.weight_sync import GROUP_NAME

        group = GROUP_NAME if self.index == 0 else f"{GROUP_NAME}-r{self.index}"  # unique in this process
        return make_pusher(self.engine, self.client, timeout_s=self.push_timeout_s, clock=self.clock, group_name=group)

    def push(self, tensors: dict, version: int) -> dict | None:
        """Push ``tensors`` as ``version``; the pusher's record, or None when the engine died meanwhile (its restart
        loads the newest version anyway); an engine that fails while alive raises ``EngineError``."""
        try:
            pushed = self.pusher.push(tensors, str(version))
        except EngineError:
            if self.alive():
                raise
            return None
        self.version = version
        return pushed

    def alive(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def dead(self) -> bool:
        """True when the replica has an engine whose process exited without being stopped."""
        return self.handle is not None and not self.handle.alive()

    def served_version(self) -> str | None:
        """The weight_version the engine's ``/model_info`` shows now (asleep or not); None without a live engine."""
        if not self.alive():
            return None
        try:  # a short timeout: a hung engine must not hold up the cell's shutdown
            with self.handle.client(timeout=10.0, connect_retries=0) as client:
                return client.weight_version()
        except EngineError:
            return None

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
