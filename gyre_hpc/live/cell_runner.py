"""The cell runner: what rank c + 1 does for cell c in a live run (edge: MPI, engines, torch, Mooncake).

::

    Hello ─▶ Welcome(role, core)
    loop:  heartbeat · next order · [core: take satellites' gradients, step when the batch is complete]
           ROLLOUT: keep the engine on the newest version        TRAIN: WANT a group ─▶ gradients
                                                                 (satellite: into its gradient buffer; the
                                                                 core pulls them: live/training_side.py)
    SwitchTo(TRAIN):   drain the cell in the proxy (its calls move) · remove · stop the engine ·
                       satellite: pull the core's weights over Mooncake (checksums)   ─▶ SwitchDone(timing)
    SwitchTo(ROLLOUT): (the group in hand is finished first) · core: report its groups ·
                       start the engine on the newest weights · register with the proxy ─▶ SwitchDone(timing)
    engine died:       (ROLLOUT, the Popen polled every pass) the proxy takes it out and moves its calls ─▶
                       EngineDied · start a new engine on the newest weights ─▶ EngineRestarted
                       (per replica: a cell's other engine replicas serve on meanwhile)
                       (after engine.max_restarts restarts, or a failed start: CellFailed, the cell ends)
    Shutdown:          stop the engine · write cells/cell<c>.json · Bye
    preemption signal: noted (no more weight refreshes: under SLURM it may have reached the engine too); the
                       run goes on until rank 0's Shutdown("preempted: ..."), after which ``preempted`` is true
    resumed run:       the core loads RUN_DIR/resume/checkpoint; cells/cell<c>.json keeps the earlier switches

Slow work (drain, engine start/stop, weight pull) runs in a worker thread while the main thread keeps
sending heartbeats; only the main thread touches MPI.

Invariants (tests/integration/test_live_training.py)
- Every ``SwitchDone`` carries the switch's timing breakdown (drain_s, engine_stop_s, weight_pull_s,
  engine_start_s, register_s, total_s as they apply).
- Only the core reports training progress; it reports a step only in TRAIN (or while leaving it), so the
  allocator never sees progress from a rolling-out cell.
- A group taken from the hub is finished (its gradients reach the core) before any switch is carried out.
- A send left pending when Shutdown came keeps its request (and so its pickled buffer) until the core has taken
  the message (``dataplane.settle``, after Bye, up to ``UNSENT_SETTLE_S``): MPI reads a large message from the
  sender's memory when the core receives it, also while the core drains its data plane at the end.
- A satellite's weight pull that fails after Shutdown came (the core closed its weights when the run ended) ends
  the cell in order (Bye) instead of crashing the rank, which would fail the whole SLURM step
  (tests/integration/test_slurm_live.py); a pull that fails while the run goes on still raises.
- A rolling-out cell whose engine died reports it (``EngineDied``) and serves again with a new engine on the
  newest weights (``EngineRestarted``) before it acts on any order (tests/integration/test_live_faults.py).
"""
from __future__ import annotations

import concurrent.futures
import json
import sys
from pathlib import Path
from typing import Sequence

from gyre_hpc.allocator.cell_link import CellLink
from gyre_hpc.allocator.messages import (CellFailed, EngineDied, EngineRestarted, Shutdown, SwitchDone, SwitchTo,
                                         TrainProgress)
from gyre_hpc.allocator.types import Role
from gyre_hpc.live import dataplane as dp
from gyre_hpc.live.rollout_side import RolloutSide
from gyre_hpc.live.training_side import CoreTrainer, SatelliteTrainer
from gyre_hpc.clock import wait_until
from gyre_hpc.config import AllocatorConfig, EngineConfig, ModelConfig, ProxyConfig, TrainConfig, TransferConfig
from gyre_hpc.errors import GyreError, TransferError
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.lifecycle.recovery import StopKind, StopReason
from gyre_hpc.live.preempt import Preemption
from gyre_hpc.proxy.routing import ProxyError
from gyre_hpc.replicas import ReplicaSpec

CORE = 0  # the allocator's core cell (AllocatorServer's default)
UNSENT_SETTLE_S = 30.0  # after Bye: how long a send left pending at Shutdown waits for the core to take it
SHUTDOWN_LOOK_S = 5.0  # after a failed pull or registration: how long to look for a Shutdown that explains it


class _RunOver(Exception):
    """A weight pull failed because the run ended meanwhile (Shutdown is in the stash)."""


class CellRunner:
    def __init__(self, run_dir: Path, transport, comm, proxy_url: str, preemption: Preemption | None = None, *,
                 allocator: AllocatorConfig, engine: EngineConfig, model: ModelConfig, train: TrainConfig,
                 transfer: TransferConfig, proxy: ProxyConfig, seed: int, batch_groups: int, orders=None,
                 replicas: Sequence[ReplicaSpec] = (ReplicaSpec(0),)):
        """Each side gets its own sections; ``batch_groups`` is ``scheduler.batch_groups`` (the core steps on it);
        ``orders``: the cell's other workers (``gyre_hpc.live.workers.Orders``; None: a one-worker cell);
        ``replicas``: the engine replicas the cell serves in rollout (``replicas.leader_replicas``)."""
        self.run_dir, self.comm, self.orders = Path(run_dir), comm, orders
        self.allocator, self.max_restarts, self.batch_groups = allocator, engine.max_restarts, batch_groups
        self.training = dict(model=model, train=train, transfer=transfer, seed=seed, orders=orders)  # a trainer's
        self.cell = transport.rank - 1
        self.link = CellLink(transport, self.cell, allocator.heartbeat_interval_s)
        self.is_core = self.cell == CORE
        self.rollout = RolloutSide(self.run_dir, self.cell, proxy_url, engine=engine, model=model, transfer=transfer,
                                   proxy=proxy, seed=seed, clock=self.clock, replicas=replicas)
        self.trainer: CoreTrainer | SatelliteTrainer | None = None
        self.role = Role.ROLLOUT
        self.switches: list[dict] = []
        self.work_s = 0.0
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.stash: list = []  # orders that came while a data-plane answer was awaited
        self.unsent: list = []  # sends left pending when the run ended: their buffers must outlive them
        self.signalled = preemption or Preemption()  # rank 0 coordinates; a cell only notes the signal
        self.preempted = False
        self._carry_stats()
        self.failed = ""  # why the cell gave up (CellFailed sent): it ends without Bye
        self.final_version: str | None = None  # the engine's /model_info weight_version when the cell ended

    @property
    def clock(self):
        """The rank's one clock (the transport's): switch timings, waits and the core's final draining."""
        return self.link.clock

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        if self.is_core:  # the only optimizer state; built before Hello (no heartbeat is due yet)
            self.trainer = CoreTrainer(self.run_dir, **self.training, clock=self.clock)
        welcome = self.link.hello(self.allocator.hello_timeout_s)
        self.role = welcome.role
        if self.role is Role.ROLLOUT:
            self._busy(self.rollout.start)
        else:
            self._become_trainer()
        try:
            while True:
                self.link.beat()
                order = self.stash.pop(0) if self.stash else self.link.next_order(
                    0.0 if self.role is Role.TRAIN else 0.02)
                if isinstance(order, Shutdown):
                    self.preempted = StopReason.parse(order.reason).kind is StopKind.PREEMPTED
                    break
                if isinstance(order, SwitchTo):
                    self._switch(order)
                if self.is_core:
                    self._core_poll()
                if self.role is Role.TRAIN and not self.stash:
                    self._train_once()
                elif not self.signalled.requested:
                    if not self._keep_engine():
                        break
                    self.rollout.refresh()
        finally:
            if self.is_core:  # take what satellites still send, so none of them waits on the core
                wait_until(lambda: False, 1.0, self.clock, poll_s=0.01, idle=self._drop_grads)  # one second of draining
            self.final_version = self.rollout.served_version()  # /model_info at the end (summary)
            self.rollout.close()
            if self.trainer is not None:
                self.trainer.close()
            stats = self._stats(self.orders.stop() if self.orders is not None else [])
            self.pool.shutdown(wait=False)
        if not self.failed:  # a failed cell is LOST: the allocator expects nothing more from it
            self.link.bye()
        if self.unsent and not dp.settle(self.unsent, UNSENT_SETTLE_S, self.clock):
            print(f"gyre train: cell{self.cell}: {len(self.unsent)} gradient message(s) the core did not take within "
                  f"{UNSENT_SETTLE_S:.0f} s of the end", file=sys.stderr, flush=True)
        return stats

    def _busy(self, fn, *args):
        """Run ``fn`` in the worker thread; heartbeats go on meanwhile."""
        fut = self.pool.submit(fn, *args)
        while True:
            try:
                return fut.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                self.link.beat()

    # ------------------------------------------------------------------ engine failures
    def _keep_engine(self) -> bool:
        """Restart an engine that died on its own; False once the cell gave up (CellFailed sent)."""
        if not self.rollout.dead():
            return True
        died = self._busy(self.rollout.reap)
        self.link.send(EngineDied(cell=self.cell, **died))
        restarts = len(self.rollout.deaths)
        if restarts > self.max_restarts:
            return self._give_up(f"engine died {restarts} times (engine.max_restarts={self.max_restarts})")
        try:
            timing = self._busy(self.rollout.start)
        except GyreError as exc:
            return self._give_up(f"engine restart failed: {exc}")
        start_s = timing["engine_start_s"] + timing["register_s"]
        self.rollout.deaths[-1]["restart_s"] = start_s
        back = self.rollout.replicas[self.rollout.deaths[-1]["replica"]]  # the dead replica, restarted alone
        self.link.send(EngineRestarted(cell=self.cell, pid=back.handle.pid, start_s=start_s,
                                       version=max(back.version, 0), engine=back.name, restarts=restarts))
        return True

    def _give_up(self, reason: str) -> bool:
        self.failed = reason
        self.link.send(CellFailed(cell=self.cell, reason=reason))
        return False

    # ------------------------------------------------------------------ switches
    def _switch(self, order: SwitchTo) -> None:
        t0 = self.clock.now()
        timing: dict = {}
        if order.role is Role.TRAIN:
            if self.rollout.running:
                timing.update(self._busy(self.rollout.leave))
            try:
                timing.update(self._become_trainer())
            except _RunOver:
                return  # Shutdown is next in the stash
        else:
            if self.is_core:
                self._report()
            try:
                timing.update(self._busy(self.rollout.start))
            except ProxyError:  # rank 0 stops the proxy when the run ends (a preemption during this switch)
                if self._shutdown_came():
                    return  # Shutdown is next in the stash; the engine stops with the cell (rollout.close)
                raise
        self.role = order.role
        timing["total_s"] = self.clock.now() - t0
        clean = {k: float(v) for k, v in timing.items() if k.endswith("_s")}
        self.link.send(SwitchDone(cell=self.cell, role=order.role, order=order.order, timing=clean))
        self.switches.append({"order": order.order, "to": order.role.value, **timing})

    def _become_trainer(self) -> dict:
        """Satellite: build the model once, then pull the core's newest weights; returns the timing."""
        if self.is_core:
            return {}
        timing = {}
        if self.trainer is None:
            t0 = self.clock.now()
            self.trainer = self._busy(lambda: SatelliteTrainer(self.run_dir, **self.training, slots=self.batch_groups,
                                                                clock=self.clock))
            timing["trainer_init_s"] = self.clock.now() - t0
        t0 = self.clock.now()
        pulled = self._pull()
        timing["weight_pull_s"] = self.clock.now() - t0
        timing["pulled_version"] = -1 if pulled is None else pulled["version"]
        return timing

    # ------------------------------------------------------------------ training
    def _drop_grads(self) -> None:
        dp.discard(self.comm, dp.GRADS)

    def _train_once(self) -> None:
        self.comm.send({"cell": self.cell}, dest=dp.HUB, tag=dp.WANT)
        reply = self._await_group()
        if reply is None:  # Shutdown came first: rank 0 no longer serves the data plane
            return
        group, version = reply["group"], reply["version"]
        if group is None:
            self.clock.sleep(0.02)
            return
        t0 = self.clock.now()
        if not self.is_core:
            try:
                self._pull(version)
            except _RunOver:
                return
        z, grads, loss, extra = self.trainer.grads(group)
        seconds = self.clock.now() - t0
        lag = dp.lag_stats(group.batch, version, group.ready_version)
        if self.is_core:
            if self.trainer.add(version, group.gid, z, grads, loss, lag, group, extra):
                self.work_s += seconds
        else:  # gradients into the satellite's buffer, the descriptor to the core (which pulls them)
            self._send_data(self.trainer.message(version, group, z, grads, loss, lag, extra, seconds),
                            CORE + 1, dp.GRADS)

    def _pull(self, version: int | None = None) -> dict | None:
        """Satellite: the core's weights (``SatelliteTrainer.ensure``); ``_RunOver`` when the pull failed because
        Shutdown came meanwhile (the core closes its weights when the run ends), any other failure raises."""
        try:
            return self._busy(self.trainer.ensure, version)
        except TransferError:
            if self._shutdown_came():
                raise _RunOver from None
            raise

    def _shutdown_came(self) -> bool:
        """After a failure the end of the run would explain (the core closed its weights, rank 0 stopped the
        proxy): whether a Shutdown came. It may sit unread in MPI (no progress during the failed call): look for a
        while, not just once."""
        return wait_until(lambda: any(isinstance(o, Shutdown) for o in self.stash), SHUTDOWN_LOOK_S, self.clock,
                          poll_s=0.0, idle=self._look_for_order)  # the look waits (next_order blocks up to 0.05 s)

    def _look_for_order(self) -> None:
        self.link.beat()
        if (order := self.link.next_order(0.05)) is not None:
            self.stash.append(order)

    def _send_data(self, payload: dict, dest: int, tag: int) -> None:
        """Send without blocking the heartbeats (a large message waits until the core receives it)."""
        req = self.comm.isend(payload, dest=dest, tag=tag)
        while not req.test()[0]:
            self.link.beat()
            if any(isinstance(o, Shutdown) for o in self.stash):
                # the run is over: the core drains what is left unread, and MPI may still read this send's
                # pickled buffer then; dropping the request would free it under MPI (the core read garbage)
                self.unsent.append(req)
                return
            order = self.link.next_order(0.002)
            if order is not None:
                self.stash.append(order)

    def _await_group(self) -> dict | None:
        """The hub's answer; orders that arrive meanwhile are kept for the loop (None once Shutdown came)."""
        while (got := dp.poll(self.comm, dp.GROUP, dp.HUB)) is None:
            self.link.beat()
            if any(isinstance(o, Shutdown) for o in self.stash):
                return None
            order = self.link.next_order(0.002)
            if order is not None:
                self.stash.append(order)
        return got[1]

    def _core_poll(self) -> None:
        while (got := dp.poll(self.comm, dp.GRADS)) is not None:
            g = got[1]  # a late copy of a group re-issued after its satellite was lost is dropped (not pulled)
            if self._busy(self.trainer.add_remote, g):  # the pull runs beside the heartbeats
                self.work_s += g["seconds"]
        if self.role is not Role.TRAIN:
            return
        if self.trainer.groups >= self.batch_groups:
            rec = self._busy(self.trainer.step)  # train.epochs updates + publish: heartbeats go on meanwhile
            # STEPPED is the step's one report: it carries the groups processed since the last TrainProgress, and
            # rank 0 applies it to the allocator's state in the pass its hub takes it (no TrainProgress for a step)
            progress = {"groups": self.trainer.unreported, "work_s": self.work_s}
            self.comm.send({**rec, "progress": progress}, dest=dp.HUB, tag=dp.STEPPED)
            self.trainer.unreported, self.work_s = 0, 0.0
        elif self.trainer.unreported:
            self._report()

    def _report(self) -> None:
        """The groups processed since the last report (TrainProgress at the current version; never a step)."""
        tr = self.trainer
        if not tr.unreported:
            return
        self.link.send(TrainProgress(cell=self.cell, version=tr.version, groups=tr.unreported, work_s=self.work_s))
        tr.unreported, self.work_s = 0, 0.0

    def _served_workers(self, workers: int) -> int:
        """Workers whose GPUs served rollouts: all of them once the cell's engine replicas started."""
        return workers if self.rollout.starts or self.rollout.wakes else 0

    def _carry_stats(self) -> None:
        """A resumed run's cell continues the earlier segments' records (switches, pulls)."""
        from gyre_hpc.lifecycle import resume

        path = self.run_dir / "cells" / f"cell{self.cell}.json"
        self.earlier = json.loads(path.read_text()) if resume.exists(self.run_dir) and path.is_file() else {}
        self.switches = list(self.earlier.get("switches", []))

    def _stats(self, reports: list) -> dict:
        """The cell's record (RUN_DIR/cells/cellN.json); ``reports``: what each other worker did."""
        pulls = self.earlier.get("pulls", []) + getattr(self.trainer, "pulls", [])
        stats = {"cell": self.cell, "core": self.is_core, "switches": self.switches, "pulls": pulls,
                 "pull_retries": self.earlier.get("pull_retries", []) + getattr(self.trainer, "pull_retries", []),
                 "engine_replicas": len(self.rollout.replicas),
                 "engine_starts": self.rollout.starts, "engine_wakes": self.rollout.wakes,
                 "weight_updates": self.rollout.updates, "weight_syncs": self.rollout.syncs,
                 "weight_sync_errors": self.rollout.pull_errors,
                 "engine_weight_version": self.final_version,
                 "engine_deaths": self.rollout.deaths, "failed": self.failed,
                 "grads_dropped": self.trainer.ledger.dropped if self.is_core else [],
                 "grad_pulls": self.trainer.grad_pulls() if self.is_core else None,
                 "version": getattr(self.trainer, "version", None),
                 "restored": getattr(self.trainer, "restored", None), "preempted": self.preempted,
                 "workers": 1 + len(reports), "workers_trained": (self.trainer is not None) + sum(
                     r.trained for r in reports), "workers_served": self._served_workers(1 + len(reports)),
                 "parallel": getattr(self.trainer, "parallel", None)}
        atomic_write_json(self.run_dir / "cells" / f"cell{self.cell}.json", stats)
        return stats
