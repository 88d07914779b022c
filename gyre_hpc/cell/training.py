"""The training side of a cell (edge: torch, megatron-core, Mooncake).

Core cell (``CoreTrainer``): holds the ``Trainer`` (the only optimizer state) for the whole run. It trains
groups the hub hands it, receives the satellites' gradients, and once it holds all ``batch_groups`` groups
of the version it sums them weighted by trained tokens, clips, applies AdamW, bumps the version, writes the
engines' weights directory, publishes the weights over the transfer backend and writes ``LATEST.json``.

Satellite (``SatelliteTrainer``): a model without optimizer use; before computing gradients of version v it
pulls version v from the core (Mooncake, checksums verified) and sends ``(Z, grads)`` to the core.

Invariants (tests/integration/test_live_training.py)
- The step's gradient is ``sum_i Z_i g_i / sum_i Z_i`` over the step's groups (g_i normalised by its own
  trained tokens Z_i), i.e. the gradient of the whole batch's token-mean loss, wherever each group ran.
- A satellite computes gradients only on weights of the version the group was handed out for.
- A resumed core (RUN_DIR/resume exists) starts from the saved checkpoint: weights, optimizer and version as
  they were after the last step before the preemption; ``restored`` records that version and the weights'
  checksum.
- The core sums each group at most once per step, and only gradients of its current version (``dp.GradLedger``:
  a group re-issued after a satellite was lost may arrive twice, or late).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from gyre_hpc.cell import dataplane as dp
from gyre_hpc.cell import store
from gyre_hpc.config import GyreConfig
from gyre_hpc.errors import TransferError


class _Side:
    def __init__(self, cfg: GyreConfig):
        from gyre_hpc.train.model import init_parallel
        from gyre_hpc.train.step import Trainer

        init_parallel(seed=cfg.run.seed)
        self.cfg = cfg
        self.trainer = Trainer(cfg.model, cfg.train, cfg.run.seed)

    def grads(self, group: dp.Group) -> tuple[float, dict[str, np.ndarray], float]:
        """(Z, gradients normalised by Z, loss) of one group; Z = 0 when nothing of it trains."""
        if group.batch is None or group.trained_tokens == 0:
            return 0.0, {}, 0.0
        loss, grads = self.trainer.loss_and_grads(group.batch)
        return float(group.batch.loss_mask.sum()), dp.to_numpy(grads), loss


class CoreTrainer(_Side):
    def __init__(self, cfg: GyreConfig, run_dir: Path):
        from gyre_hpc.transfer import make_publisher

        super().__init__(cfg)
        self.run_dir = run_dir
        self.restored = self._restore()
        self.publisher = make_publisher(cfg.transfer)
        self.reset_step()
        self.ledger = dp.GradLedger(self.version)
        self.unreported = 0
        self.publish()

    def _restore(self) -> dict | None:
        from gyre_hpc import resume
        from gyre_hpc.engines.weights import weights_checksum

        if not resume.exists(self.run_dir):
            return None
        self.trainer.load_checkpoint(resume.resume_dir(self.run_dir) / resume.CHECKPOINT)
        return {"version": self.version, "checksum": weights_checksum(self.trainer.export_weights())}

    def reset_step(self) -> None:
        self.acc: dict[str, np.ndarray] = {}
        self.z = 0.0
        self.loss_sum = 0.0
        self.groups = 0
        self.lag = [0.0, 0, 0]

    @property
    def version(self) -> int:
        return self.trainer.version

    def add(self, version: int, gid: int, z: float, grads: dict, loss: float, lag: tuple) -> bool:
        """Take group ``gid``'s gradients (own or a satellite's) for ``version``; False (nothing added) for a
        copy the step already holds or one of an older version (``dp.GradLedger``)."""
        if not self.ledger.take(version, gid):
            return False
        for k, g in grads.items():
            self.acc[k] = self.acc[k] + z * g if k in self.acc else z * g
        self.z += z
        self.loss_sum += z * loss
        self.groups += 1
        self.unreported += 1
        self.lag = [self.lag[0] + lag[0], self.lag[1] + lag[1], max(self.lag[2], lag[2])]
        return True

    def step(self) -> dict:
        """Apply the summed gradients (AdamW), publish the new version; returns the step's record."""
        t0 = time.perf_counter()
        tr = self.trainer
        tr.optimizer.zero_grad(set_to_none=True)
        for name, p in tr.model.named_parameters():
            if name in self.acc:
                p.grad = torch.from_numpy(self.acc[name] / self.z).to(p.dtype)
        norm = tr.clip_grads() if self.acc else 0.0
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        tr.version += 1
        gids = self.ledger.stepped()
        t1 = time.perf_counter()
        pub = self.publish()
        lag_tokens = max(self.lag[1], 1)
        rec = {"version": tr.version, "groups": self.groups, "trained_tokens": int(self.z),
               "loss": self.loss_sum / self.z if self.z else None, "grad_norm": norm,
               "staleness_mean": self.lag[0] / lag_tokens, "staleness_max": self.lag[2],
               "lag_tokens": self.lag[1], "optimizer_s": t1 - t0, "gids": gids, **pub}
        self.reset_step()
        return rec

    def publish(self) -> dict:
        """Weights directory for engines, Mooncake buffer for satellites, then LATEST.json; returns timings."""
        from gyre_hpc.engines.weights import save_weights

        t0 = time.perf_counter()
        weights = self.trainer.export_weights()
        path = save_weights(store.version_dir(self.run_dir, self.version), weights, str(self.version))
        t1 = time.perf_counter()
        desc = self.publisher.publish({k: v.numpy() for k, v in weights.items()}, version=self.version)
        t2 = time.perf_counter()
        store.write_latest(self.run_dir, self.version, path, desc.to_dict())
        self.trainer.save_checkpoint(self.run_dir / "checkpoints" / "latest")
        return {"save_weights_s": t1 - t0, "publish_s": t2 - t1, "checkpoint_s": time.perf_counter() - t2}

    def close(self) -> None:
        self.publisher.close()


class SatelliteTrainer(_Side):
    def __init__(self, cfg: GyreConfig, run_dir: Path):
        from gyre_hpc.transfer import make_puller

        super().__init__(cfg)
        self.run_dir = run_dir
        self.puller = make_puller(cfg.transfer)
        self.version = -1
        self.pulls: list[dict] = []

    def ensure(self, version: int | None = None, timeout_s: float = 60.0, idle=None) -> dict | None:
        """Pull the core's weights of ``version`` (None: the latest) unless they are loaded; returns the stats."""
        from gyre_hpc.transfer import WeightDescriptor

        deadline = time.monotonic() + timeout_s
        while True:
            latest = store.read_latest(self.run_dir)
            want = version if version is not None else (latest or {}).get("version")
            if want is not None and want == self.version:
                return None
            if latest is not None and latest["version"] == want and latest.get("descriptor"):
                try:
                    arrays, stats = self.puller.pull(WeightDescriptor.from_dict(latest["descriptor"]))
                except TransferError as exc:
                    if "stale" not in str(exc) or time.monotonic() > deadline:
                        raise
                    continue  # the core published a newer version meanwhile: read LATEST again
                state = {k: torch.from_numpy(np.array(a)) for k, a in arrays.items()}
                self.trainer.model.load_state_dict(state, strict=False)
                self.version = self.trainer.version = want
                rec = {"version": want, "bytes": stats.bytes, "seconds": stats.seconds,
                       "gb_per_s": stats.gb_per_s, "checksum_ok": stats.checksum_ok, "backend": stats.backend}
                self.pulls.append(rec)
                return rec
            if time.monotonic() > deadline:
                raise TransferError(f"version {want} of the core's weights not published within {timeout_s} s")
            if idle is not None:
                idle()
            time.sleep(0.02)

    def close(self) -> None:
        self.puller.close()
