"""The training side of a cell (edge: torch, megatron-core, Mooncake).

Core cell (``CoreTrainer``): holds the ``Trainer`` (the only optimizer state) for the whole run. It trains
groups the hub hands it, receives the satellites' gradients (and their groups), and once it holds all
``batch_groups`` groups of the version it sums them weighted by trained tokens, clips and applies AdamW. With
``train.epochs = E > 1`` it then makes E - 1 more AdamW updates over the same groups, recomputing their
gradients itself on the updated weights (PPO epochs: the importance ratio is taken against the generating
policy's logprobs). Only then does it bump the version (one version per step, whatever E), publish the weights
over the transfer backend (filled bucket by bucket from the cell's shards, ``train.weight_bucket_mb``), write the
engines' weights directory from that buffer and write ``LATEST.json``.

Why the later epochs run at the core: a satellite's gradient for epoch e would need the weights after epoch
e - 1, i.e. a weight pull and a round trip per epoch. The first epoch, where all the step's groups are new, is
spread over every training cell; the later ones cost the core E - 1 forward/backward passes over the step's
groups (small next to the rollouts they reuse).

Satellite (``SatelliteTrainer``): a model without optimizer use; before computing gradients of version v it
pulls version v from the core (Mooncake, checksums verified), then publishes each group's gradients into its
registered gradient buffer (``transfer.gradients.GradientSender``: one contiguous float32 region per group, in
the model's parameter order, checksummed) and sends only a small header (version, gid, Z, loss, lag, the
buffer's descriptor) on the data plane (``message``). The core (``add_remote``) asks its ``GradLedger`` first and
pulls only a copy it will sum; a pull that fails (the satellite left, or rewrote that segment) drops the copy and
the step goes on (the hub re-issues a LOST satellite's groups).

Why buffers and not torch.distributed collectives: the core takes gradients asynchronously, group by group, from
a varying set of satellites, and drops duplicate and stale copies; a collective would make every member wait for
every other one, so a satellite leaving mid-step would block the core's reduce. A one-sided pull fails on its own
(at once for a dead peer, within ``transfer.timeout_s`` for a frozen one) and keeps every invariant below.

Invariants (tests/integration/test_live_training.py)
- The step's gradient is ``sum_i Z_i g_i / sum_i Z_i`` over the step's groups (g_i normalised by its own
  trained tokens Z_i), i.e. the gradient of the whole batch's token-mean loss, wherever each group ran.
- A satellite computes gradients only on weights of the version the group was handed out for.
- A resumed core (RUN_DIR/resume exists) starts from the saved checkpoint: weights, optimizer and version as
  they were after the last step before the preemption; ``restored`` records that version and the weights'
  checksum.
- The core sums each group at most once per step, and only gradients of its current version (``dp.GradLedger``:
  a group re-issued after a satellite was lost may arrive twice, or late); it pulls a satellite's gradients only
  after the ledger admits them, and a failed pull sums nothing (``grads_dropped`` with why "pull failed").
- No gradient array is pickled: a satellite's GRADS message holds the gradient buffer's descriptor; the group
  and the trainer's logprobs go along only when ``train.epochs > 1`` (tests/integration/test_grad_exchange.py).
- The core's sum over pulled gradients is bit-identical to the sum over the satellite's own arrays.
- A step makes exactly ``train.epochs`` AdamW updates, each over all of the step's groups with trained tokens
  (``epoch_gids`` in the record; one update when none has any), and raises the version by exactly one.
- Per step, pre-queue + in-queue staleness = total staleness (``dataplane.lag_stats``), per trained token.
- The step record's ``logprob_abs_diff_*`` combine the first forward of each of its groups (core or satellite,
  on the weights of the step's version: ``gyre_hpc.train.agreement``); epochs 2..E weigh each token against
  that first forward's trainer logprob (``train.tis_cap``), which the satellite sends along with its gradients.
- With ``train.device_token_s`` > 0 (an emulated device) a group's gradients take at least device_token_s x its
  trained tokens of the side's clock, and are the same as without it (tests/integration/test_train_device_floor.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gyre_hpc.live import dataplane as dp
from gyre_hpc.live import store
from gyre_hpc.live.workers import Orders, build_trainer
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import ModelConfig, TrainConfig, TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.train import agreement
from gyre_hpc.transfer.gradients import GradientReceiver, GradientSender


class _Side:
    def __init__(self, model: ModelConfig, train: TrainConfig, transfer: TransferConfig, seed: int,
                 clock: Clock | None = None, orders: Orders | None = None):
        """``orders``: the cell's other workers (gyre_hpc.live.workers), None or one worker: this process alone."""
        self.train, self.transfer = train, transfer
        self.clock = clock or WallClock()  # step timings, the satellite's wait for a published version
        self.trainer = build_trainer(model, train, seed, self.clock, orders)
        self.parallel = parallel_sizes()

    def grads(self, group: dp.Group, trainer_old: np.ndarray | None = None) -> tuple[float, dict, float, dict]:
        """(Z, gradients normalised by Z, loss, extra) of one group; Z = 0 when nothing of it trains. ``extra``
        of a first forward (``trainer_old`` None) holds the agreement record and the trainer's logprobs
        (``trainer_logprob``, what later epochs weigh against)."""
        if group.batch is None or group.trained_tokens == 0:
            return 0.0, {}, 0.0, agreement.empty()
        t0, z = self.clock.now(), float(group.batch.loss_mask.sum())
        metrics, grads, mine = self.trainer.group_grads_full(group.batch, trainer_old)
        if (rest := self.train.device_token_s * z - (self.clock.now() - t0)) > 0:  # emulated device: time only
            self.clock.sleep(rest)
        extra = {**{k: metrics[k] for k in agreement.KEYS}, "trainer_logprob": mine} if trainer_old is None else {}
        return z, dp.to_numpy(grads), metrics["loss"], extra


class CoreTrainer(_Side):
    def __init__(self, run_dir: Path, *, model: ModelConfig, train: TrainConfig, transfer: TransferConfig, seed: int,
                 clock: Clock | None = None, orders: Orders | None = None):
        from gyre_hpc.transfer import make_publisher

        super().__init__(model, train, transfer, seed, clock, orders)
        self.run_dir = run_dir
        self.restored = self._restore()
        self.publisher = make_publisher(transfer)
        self.receiver = GradientReceiver(transfer)
        self.reset_step()
        self.ledger = dp.GradLedger(self.version)
        self.unreported = 0
        self.publish()

    def _restore(self) -> dict | None:
        from gyre_hpc.lifecycle import resume
        from gyre_hpc.engines.weights import weights_checksum

        if not resume.exists(self.run_dir) or not resume.has_checkpoint(self.run_dir):
            return None  # a new run, or the empty resume state (version 0: the config's seed makes the weights)
        self.trainer.load_checkpoint(resume.resume_dir(self.run_dir) / resume.CHECKPOINT)
        return {"version": self.version, "checksum": weights_checksum(self.trainer.export_weights())}

    def reset_step(self) -> None:
        self.groups = 0
        self.kept: list[dp.Group] = []  # the step's groups with trained tokens (for epochs 2..E)
        self.trainer_old: dict[int, np.ndarray] = {}  # gid → the trainer's first-forward logprobs (epochs 2..E)
        self.agree: list[dict] = []  # the agreement record of each group taken this step
        self.lag: dict | None = None
        self._reset_grads()

    def _reset_grads(self) -> None:
        self.acc: dict[str, np.ndarray] = {}
        self.z = 0.0
        self.loss_sum = 0.0

    @property
    def version(self) -> int:
        return self.trainer.version

    def add(self, version: int, gid: int, z: float, grads: dict, loss: float, lag: dict,
            group: dp.Group | None = None, extra: dict | None = None) -> bool:
        """Take group ``gid``'s gradients (own or a satellite's) for ``version``, and the group for later epochs;
        False (nothing added) for a copy the step already holds or one of an older version (``dp.GradLedger``)."""
        if not self.ledger.take(version, gid):
            return False
        self._sum(z, grads, loss)
        extra = extra or {}
        if group is not None and z > 0:
            self.kept.append(group)
            if extra.get("trainer_logprob") is not None:
                self.trainer_old[group.gid] = extra["trainer_logprob"]
        self.agree.append({k: extra.get(k) for k in agreement.KEYS})
        self.groups += 1
        self.unreported += 1
        self.lag = dp.merge_lag(self.lag, lag)
        return True

    def add_remote(self, msg: dict) -> bool:
        """Take a satellite's GRADS message (``SatelliteTrainer.message``): pull its gradients if the ledger admits
        them; False (nothing added) for a refused copy or a failed pull (recorded in ``ledger.dropped``)."""
        version, gid = msg["version"], msg["gid"]
        grads: dict = {}
        if msg["grads"] is not None and self.ledger.admits(version, gid):
            try:
                grads, _ = self.receiver.pull(msg["grads"])
            except TransferError as exc:  # the satellite left, or rewrote the segment: this copy is lost
                self.ledger.dropped.append({"gid": gid, "version": version, "core_version": self.version,
                                            "why": "pull failed", "error": str(exc)[:300]})
                return False
        return self.add(version, gid, msg["z"], grads, msg["loss"], msg["lag"], msg["group"], msg["extra"])

    def grad_pulls(self) -> dict:
        """What the satellites' gradient pulls moved: count, bytes, wire seconds."""
        pulls = self.receiver.pulls
        return {"n": len(pulls), "bytes": sum(p.bytes for p in pulls), "seconds": sum(p.seconds for p in pulls)}

    def _sum(self, z: float, grads: dict, loss: float) -> None:
        for k, g in grads.items():
            self.acc[k] = self.acc[k] + z * g if k in self.acc else z * g
        self.z += z
        self.loss_sum += z * loss

    def _update(self) -> tuple[float, float | None]:
        """One AdamW update with the summed gradients (on every worker of the cell, each its shards); returns
        (grad norm before clipping, token-mean loss)."""
        norm = self.trainer.apply_grads({name: g / self.z for name, g in self.acc.items()})
        return norm, (self.loss_sum / self.z if self.z else None)

    def step(self) -> dict:
        """``train.epochs`` AdamW updates, then publish the new version; returns the step's record."""
        t0 = self.clock.now()
        tokens = int(self.z)
        norm, loss = self._update()
        losses = [loss]
        for _ in range(1, self.train.epochs if self.kept else 1):
            self._reset_grads()
            for group in self.kept:
                self._sum(*self.grads(group, self.trainer_old.get(group.gid))[:3])
            losses.append(self._update()[1])
        self.trainer.version += 1
        gids = self.ledger.stepped()
        t1 = self.clock.now()
        pub = self.publish()
        rec = {"version": self.version, "groups": self.groups, "trained_tokens": tokens, "loss": loss,
               "epochs": len(losses), "loss_last_epoch": losses[-1], "grad_norm": norm,
               "epoch_gids": sorted(g.gid for g in self.kept) if len(losses) > 1 else [],
               **dp.lag_record(self.lag), **agreement.combine(self.agree), "optimizer_s": t1 - t0, "gids": gids,
               "parallel": self.parallel, **pub}
        self.reset_step()
        return rec

    def publish(self) -> dict:
        """The transfer buffer (Mooncake) that rollout cells and satellites pull, filled bucket by bucket from the
        cell's shards (``Trainer.publish_weights``: no rank gathers the whole model besides that buffer), then the
        weights directory written from that buffer, then LATEST.json; returns timings."""
        import torch

        from gyre_hpc.engines.weights import save_weights

        t0 = self.clock.now()
        desc = self.trainer.publish_weights(self.publisher)  # collective: every worker of the cell takes part
        t1 = self.clock.now()
        weights = {k: torch.from_numpy(v) for k, v in self.publisher.published().items()}
        path = save_weights(store.version_dir(self.run_dir, self.version), weights, str(self.version))
        t2 = self.clock.now()
        store.write_latest(self.run_dir, self.version, path, desc.to_dict())
        self.trainer.save_checkpoint(self.run_dir / "checkpoints" / "latest")
        return {"publish_s": t1 - t0, "save_weights_s": t2 - t1, "checkpoint_s": self.clock.now() - t2}

    def close(self) -> None:
        self.receiver.close()
        self.publisher.close()


def parallel_sizes() -> dict:
    """``{"tp", "pp", "dp"}`` of this process's training world (megatron's groups), with ``"ep"`` when a MoE model's
    experts are split over an expert-parallel group."""
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_world_size()
    return {"tp": ps.get_tensor_model_parallel_world_size(), "pp": ps.get_pipeline_model_parallel_world_size(),
            "dp": ps.get_data_parallel_world_size(), **({"ep": ep} if ep > 1 else {})}


def is_checksum_error(exc: Exception) -> bool:
    """A pull refused because its bytes do not match the manifest (``BufferPuller._verify``)."""
    return str(exc).startswith("checksum mismatch")


class SatelliteTrainer(_Side):
    def __init__(self, run_dir: Path, *, model: ModelConfig, train: TrainConfig, transfer: TransferConfig, seed: int,
                 slots: int, clock: Clock | None = None, orders: Orders | None = None):
        """``slots``: gradient segments in the satellite's buffer (``scheduler.batch_groups``)."""
        from gyre_hpc.transfer import make_puller

        super().__init__(model, train, transfer, seed, clock, orders)
        self.run_dir = run_dir
        self.puller = make_puller(transfer)
        self.sender = GradientSender(transfer, self.trainer.full_shapes(), slots=slots)  # whole-model gradients
        self.version = -1
        self.pulls: list[dict] = []
        self.pull_retries: list[dict] = []  # pulls retried after a checksum mismatch

    def ensure(self, version: int | None = None, timeout_s: float = 60.0, idle=None) -> dict | None:
        """Pull the core's weights of ``version`` (None: the latest) unless they are loaded; returns the stats."""
        from gyre_hpc.transfer import WeightDescriptor

        deadline = self.clock.now() + timeout_s
        bad = 0  # checksum failures of this pull, retried up to transfer.checksum_retries times
        while True:
            latest = store.read_latest(self.run_dir)
            want = version if version is not None else (latest or {}).get("version")
            if want is not None and want == self.version:
                return None
            if latest is not None and latest["version"] == want and latest.get("descriptor"):
                try:
                    arrays, stats = self.puller.pull(WeightDescriptor.from_dict(latest["descriptor"]))
                except TransferError as exc:
                    if is_checksum_error(exc) and bad < self.transfer.checksum_retries:
                        bad += 1
                        self.pull_retries.append({"version": want, "error": str(exc)[:300]})
                        continue  # damaged in flight (or overwritten meanwhile): pull it again
                    if "stale" not in str(exc) or self.clock.now() > deadline:
                        raise
                    continue  # the core published a newer version meanwhile: read LATEST again
                state = {k: torch.from_numpy(np.array(a)) for k, a in arrays.items()}
                self.trainer.load_weights(state)  # every worker of the cell takes its shards
                self.version = self.trainer.version = want
                rec = {"version": want, "bytes": stats.bytes, "seconds": stats.seconds,
                       "gb_per_s": stats.gb_per_s, "checksum_ok": stats.checksum_ok, "backend": stats.backend}
                self.pulls.append(rec)
                return rec
            if self.clock.now() > deadline:
                raise TransferError(f"version {want} of the core's weights not published within {timeout_s} s")
            if idle is not None:
                idle()
            self.clock.sleep(0.02)

    def message(self, version: int, group: dp.Group, z: float, grads: dict, loss: float, lag: dict,
                extra: dict, seconds: float) -> dict:
        """Publish group ``group``'s gradients of ``version`` and return the GRADS message for the core: the
        buffer's descriptor instead of the arrays; the group itself and the trainer's logprobs only when the core
        trains it again (``train.epochs > 1``)."""
        desc = self.sender.publish(grads, version, group.gid).to_dict() if grads else None
        again = self.train.epochs > 1
        extra = {k: v for k, v in extra.items() if again or k != "trainer_logprob"}
        return {"version": version, "gid": group.gid, "z": z, "grads": desc, "loss": loss, "lag": lag,
                "seconds": seconds, "group": group if again else None, "extra": extra}

    def close(self) -> None:
        self.sender.close()
        self.puller.close()
