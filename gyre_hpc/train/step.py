"""The training step: ``PackedBatch`` rows (flat or tree) → loss → gradients → one optimizer step.

One step sums the per-token loss of ``gyre_hpc.train.loss`` over all rows of the batch, normalised by the
batch's trained tokens. Rows are cut into one row per tree (``train.split_trees``) and grouped by length into
micro-batches of at most ``train.micro_batch_tokens`` padded tokens (``gyre_hpc.train.layout``), gradients
accumulating over them; the global gradient norm is clipped to ``train.grad_clip``; then AdamW steps and the policy ``version`` grows by one.
A burst (``Trainer.burst(batch, steps)``) splits its rows, in order, into ``steps`` such steps (the scheduler's mu).
The first forward of a step (before any update of it) also measures the train-inference agreement on the tokens
generated at the trainer's version (``gyre_hpc.train.agreement``), and with ``train.tis_cap`` set weighs each
token by its truncated importance weight against the engine (``gyre_hpc.train.loss``).

Invariants
- Flat and tree packings of the same paths give the same loss and the same gradients (up to float rounding):
  the normaliser is the whole batch's trained tokens, and the mask and position ids reproduce each path's
  context exactly.
- Splitting trees and micro-batching do not change the loss or the gradients (up to float rounding).
- ``version`` counts optimizer steps; ``state_dict``/``load_state_dict`` and checkpoints round-trip model,
  optimizer and version exactly.
- The metrics of a first forward carry ``logprob_abs_diff_mean/max/tokens`` over exactly the trained tokens whose
  generation version equals ``version``; the logprobs it returns map back to the batch's positions, so a later
  epoch (``forward_backward(batch, trainer_old)``) weighs every token against its own first-forward logprob.
- Tokens at positions beyond ``model.max_seq_len`` are left out by the explicit rule ``train.overlong`` (cut the
  path's tail, or drop the tree) and counted in the metrics (``overlong_tokens_cut``,
  ``overlong_trained_tokens_cut``); the normaliser is the trained tokens kept. A batch with token ids outside
  the vocabulary, or no trained token (left), is refused with a ``TrajectoryError`` before any computation.
- Memory: tree attention (``model.attention: tree``) and the chunked output layer (``train.logits_chunk_tokens``)
  hold no ``[T, T]`` tensor and no full-vocabulary logits of a micro-batch; ``train.recompute`` keeps one layer's
  activations at a time. None changes the loss or the gradients beyond float rounding.
- ``train.distributed_optimizer`` (ZeRO-1, ``gyre_hpc.train.zero``) shards the AdamW moments over the data-parallel
  replicas and changes no weight: a sharded step equals the unsharded one bit for bit.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import ModelConfig, TrainConfig
from gyre_hpc.errors import TrajectoryError
from gyre_hpc.train import agreement, checkpoint, moe, zero
from gyre_hpc.train.adamw import AdamW
from gyre_hpc.train.layout import cut_overlong, layout
from gyre_hpc.train.loss import chunked_logprobs, gather_logprobs, policy_loss, ppo_stats, tis_weights
from gyre_hpc.train.model import build_model, enable_recompute, forward_hidden, forward_logits, output_logits
from gyre_hpc.trajectory.batch import FIELDS, PackedBatch
from gyre_hpc.trajectory.collate import to_tensors


def split_rows(batch: PackedBatch, parts: int) -> list[PackedBatch]:
    """``parts`` consecutive row groups of ``batch`` (in order; sizes differ by at most one)."""
    R = batch.shape[0]
    if parts > R:
        raise TrajectoryError(f"cannot split a batch of {R} rows into {parts} optimizer steps (scheduler.mu)")
    bounds = np.linspace(0, R, parts + 1).round().astype(int)
    names = FIELDS + ("lengths",)
    return [
        dataclasses.replace(batch, **{n: getattr(batch, n)[a:b] for n in names}) for a, b in zip(bounds, bounds[1:])
    ]


def _data_parallel() -> tuple[int, int, object]:
    """(this replica's rank, replicas, their group): megatron's data-parallel group, or one replica."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_data_parallel_world_size() == 1:
        return 0, 1, None
    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_data_parallel_group()


class Trainer:
    """A megatron ``GPTModel`` with an AdamW optimizer that trains on ``PackedBatch`` objects."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, seed: int = 0, clock: Clock | None = None):
        self.clock = clock or WallClock()  # step_time_s
        if train_cfg.threads is not None:
            torch.set_num_threads(train_cfg.threads)
        self.model_cfg = model_cfg
        self.cfg = train_cfg
        self.model = build_model(model_cfg, seed)
        if train_cfg.recompute:
            enable_recompute(self.model)
        self._head = lambda h: output_logits(self.model, h)
        moe.check_world(model_cfg, train_cfg)
        self._experts = {id(p) for n, p in self.model.named_parameters() if moe.is_expert(n)}
        self.device = next(self.model.parameters()).device
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = AdamW(
            self.params, lr=train_cfg.lr, betas=tuple(train_cfg.betas), weight_decay=train_cfg.weight_decay
        )
        self.sharded = self._shard_optimizer()
        self.version = 0

    def _shard_optimizer(self) -> zero.ShardedOptimizer | None:
        """ZeRO-1 over the data-parallel replicas (``train.distributed_optimizer``), or None (one replica: nothing
        to shard; expert parallel: the replicas hold different experts)."""
        if not self.cfg.distributed_optimizer or moe.ep_rank_size()[1] > 1:
            return None
        dp_rank, dp, group = _data_parallel()
        return zero.ShardedOptimizer(self.optimizer, self.params, dp_rank, dp, group) if dp > 1 else None

    def _optimizer_step(self) -> None:
        (self.sharded or self.optimizer).step()
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------------------------------ forward
    def _check(self, batch: PackedBatch) -> None:
        if batch.trained_tokens <= 0:
            raise TrajectoryError(f"batch of shape {batch.shape} has no trained token (loss_mask is all zero)")
        top = int(batch.input_ids.max(initial=0))
        if top >= self.model_cfg.vocab_size or int(batch.input_ids.min(initial=0)) < 0:
            raise TrajectoryError(f"token id {top} outside the vocabulary of model.vocab_size={self.model_cfg.vocab_size}")

    def _accumulate(self, batch: PackedBatch) -> dict[str, float]:
        """Forward and backward over all micro-batches; gradients are left in ``.grad``."""
        return self.forward_backward(batch)[0]

    def forward_backward(self, batch: PackedBatch, trainer_old: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
        """Forward and backward over all micro-batches, gradients left in ``.grad``; returns the metrics and the
        trainer's logprob of every trained token as a float32 array shaped like ``batch`` (0 elsewhere).

        ``trainer_old`` None: this is the step's first forward on these weights; the metrics then carry the
        train-inference agreement (``gyre_hpc.train.agreement``) and TIS weighs against the logprobs computed now.
        A later epoch passes the array the first forward returned (TIS and its ppo ratio keep that reference)."""
        self._check(batch)
        whole = batch
        batch, origin0, overlong = cut_overlong(whole, self.model_cfg.max_seq_len, self.cfg.overlong)
        if batch.trained_tokens <= 0:
            raise TrajectoryError(
                f"no trained token left below model.max_seq_len={self.model_cfg.max_seq_len} after "
                f"train.overlong={self.cfg.overlong} (deepest position id {int(whole.position_ids.max(initial=0))})")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        Z = float(batch.loss_mask.sum())
        ref = None if trainer_old is None else torch.from_numpy(np.asarray(trainer_old, np.float32).reshape(-1))
        loss_sum, kept = 0.0, []
        # expert parallel: every rank of the group runs every micro-batch (gyre_hpc.train.moe), no data split
        dp_rank, dp, dp_group = (0, 1, None) if moe.ep_rank_size()[1] > 1 else _data_parallel()
        parts = list(layout(batch, self.cfg.split_trees, self.cfg.micro_batch_tokens, origin0))
        for part, origin in parts[dp_rank::dp]:  # data parallel: each replica its share of the micro-batches
            if part.trained_tokens == 0:
                continue
            tree = self.model_cfg.attention == "tree"
            m = to_tensors(part, self.device, dense_mask=not tree)
            mask = m["span_end"] if tree else m["attention_mask"]
            chunk = self.cfg.logits_chunk_tokens
            if chunk is None:
                logits = forward_logits(self.model, m["input_ids"], m["position_ids"], mask)
                logp, entropy, (r, c) = gather_logprobs(logits, m["parent"], m["input_ids"], m["loss_mask"] > 0)
            else:
                hidden = forward_hidden(self.model, m["input_ids"], m["position_ids"], mask)
                logp, entropy, (r, c) = chunked_logprobs(hidden, self._head, m["parent"], m["input_ids"],
                                                         m["loss_mask"] > 0, chunk)
            weight, engine, adv = m["loss_mask"][r, c], m["old_logprob"][r, c], m["advantage"][r, c]
            at = torch.from_numpy(origin[r.cpu().numpy(), c.cpu().numpy()])
            old, tis = engine, None
            if self.cfg.tis_cap is not None:
                old = logp.detach() if ref is None else ref[at].to(self.device)
                tis = tis_weights(old, engine, self.cfg.tis_cap)
            loss = policy_loss(logp, adv, weight, Z, self.cfg.loss, old, self.cfg.clip_eps, tis)
            loss.backward()
            loss_sum += float(loss.detach())
            kept.append((logp.detach(), entropy, weight, old, engine, m["version"][r, c], at, tis))
        if dp > 1:
            loss_sum, kept = self._reduce_replicas(loss_sum, kept, dp, dp_group)
        moe.unreplicate_expert_grads(self.model)
        cols = list(zip(*kept))
        logp, entropy, weight, old, engine, gen, at = (torch.cat(x) for x in cols[:7])
        stats = ppo_stats(logp, old, weight, self.cfg.clip_eps) if self.cfg.loss == "ppo" else {}
        if self.cfg.tis_cap is not None:
            tis = torch.cat(cols[7])
            stats.update(tis_weight_mean=float((tis * weight).sum() / Z),
                         tis_truncated_frac=float(((tis >= self.cfg.tis_cap).float() * weight).sum() / Z))
        if trainer_old is None:
            stats.update(agreement.record(logp.cpu().numpy(), engine.cpu().numpy(), gen.cpu().numpy(), self.version))
        mine = np.zeros(whole.input_ids.size, np.float32)
        mine[at.numpy()] = logp.cpu().numpy()
        return {
            "loss": loss_sum,
            "trained_tokens": Z,
            "tokens": float(batch.tokens),
            "mean_logp": float((logp * weight).sum() / Z),
            "entropy": float((entropy * weight).sum() / Z),
            **overlong,
            **stats,
        }, mine.reshape(whole.shape)

    def _reduce_replicas(self, loss_sum: float, kept: list, dp: int, group) -> tuple[float, list]:
        """Data parallel: sum the replicas' gradients (each already normalised by the whole batch's trained
        tokens, so the sum is the batch's gradient) and gather every replica's per-token records, so that every
        replica returns the metrics and logprobs of the whole batch."""
        for p in self.params:  # every replica, the same parameters in the same order (zeros where it had none)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)
        mine = (loss_sum, [tuple(None if t is None else t.cpu() for t in k) for k in kept])
        gathered: list = [None] * dp
        dist.all_gather_object(gathered, mine, group=group)
        return sum(g[0] for g in gathered), [k for g in gathered for k in g[1]]

    def loss_and_grads(self, batch: PackedBatch) -> tuple[float, dict[str, torch.Tensor]]:
        """The step's loss and a copy of every parameter gradient (no optimizer step)."""
        metrics, grads, _ = self.group_grads(batch)
        return metrics["loss"], grads

    def group_grads(self, batch: PackedBatch, trainer_old: np.ndarray | None = None
                    ) -> tuple[dict, dict[str, torch.Tensor], np.ndarray]:
        """``forward_backward``, then a copy of every parameter gradient (no optimizer step): what a training cell
        computes for one group (metrics, gradients, the trainer's logprobs for later epochs)."""
        metrics, mine = self.forward_backward(batch, trainer_old)
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return metrics, grads, mine

    # ------------------------------------------------ the whole model's view (what a cell's leader exchanges)
    def group_grads_full(self, batch: PackedBatch, trainer_old: np.ndarray | None = None
                         ) -> tuple[dict, dict[str, torch.Tensor], np.ndarray]:
        """``group_grads`` with every gradient as the single-rank model would hold it (tensor-parallel shards
        gathered; data-parallel replicas summed): what goes into the core's sum, wherever the group ran."""
        metrics, grads, mine = self.group_grads(batch, trainer_old)
        return metrics, moe.gather_expert_grads(
            self.model, checkpoint.gather_tensors(self.model, grads, self.model_cfg.swiglu)), mine

    def apply_grads(self, full: dict[str, np.ndarray]) -> float:
        """One AdamW update with ``full`` (name -> whole-model gradient) as the gradients, clipped to
        ``train.grad_clip``; returns the norm before clipping (0 when ``full`` is empty). ``full`` is left as it was."""
        self.optimizer.zero_grad(set_to_none=True)
        full = moe.to_local(full, self.model_cfg.experts)  # expert parallel: this rank's experts, local names
        for name, p in self.model.named_parameters():
            if name in full:
                g = checkpoint.local_shard(p, name, torch.from_numpy(np.asarray(full[name])), self.model_cfg.swiglu)
                # on the weights' device (CPU gradients, CUDA weights), a copy: clipping scales it in place
                p.grad = g.to(device=p.device, dtype=p.dtype, copy=True).contiguous()
        norm = self.clip_grads() if full else 0.0
        self._optimizer_step()
        return norm

    def load_weights(self, full: dict[str, torch.Tensor]) -> None:
        """Load whole-model tensors (``export_weights``'s form: another cell's, any layout) into this rank's shards."""
        params = dict(self.model.named_parameters())
        state = {k: checkpoint.local_shard(params[k], k, v, self.model_cfg.swiglu) if k in params else v
                 for k, v in moe.to_local(full, self.model_cfg.experts).items()}
        self.model.load_state_dict(state, strict=False)

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape in the single-rank model (the form of ``group_grads_full``'s gradients)."""
        return moe.global_shapes({n: checkpoint.full_shape(p) for n, p in self.model.named_parameters()})

    def set_version(self, version: int) -> None:
        self.version = int(version)

    # -------------------------------------------------------------------------------------------- steps
    def _grad_norm(self) -> float:
        from megatron.core import parallel_state as ps

        tp_rank = ps.get_tensor_model_parallel_rank()
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params:
            if id(p) in self._experts:
                continue  # summed over the expert-parallel group below
            if p.grad is not None and (getattr(p, "tensor_model_parallel", False) or tp_rank == 0):
                sq += p.grad.detach().double().pow(2).sum()
        if ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        if self._experts:
            sq += moe.expert_grad_sq(self.model, self.device)
        return math.sqrt(float(sq))

    def clip_grads(self) -> float:
        """Scale the gradients so their global norm is at most ``train.grad_clip``; returns the norm before."""
        norm = self._grad_norm()
        if self.cfg.grad_clip is not None and norm > self.cfg.grad_clip:
            scale = self.cfg.grad_clip / (norm + 1e-6)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm

    def step(self, batch: PackedBatch) -> dict[str, float]:
        """Forward + backward + clip + one AdamW step; returns metrics (loss, tokens, logp, entropy, grad_norm)."""
        t0 = self.clock.now()
        metrics = self._accumulate(batch)
        norm = self.clip_grads()
        self._optimizer_step()
        self.version += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return {**metrics, "grad_norm": norm, "version": self.version, "step_time_s": self.clock.now() - t0}

    def burst(self, batch: PackedBatch, steps: int) -> list[dict[str, float]]:
        """``steps`` optimizer steps over the batch's rows, split in order."""
        return [self.step(part) for part in split_rows(batch, steps)]

    # -------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.sharded is not None:
            self.sharded.keep_owned()
        self.version = int(state["version"])

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Flat ``{name: full CPU tensor}`` (tensor-parallel shards gathered): what a rollout engine pulls."""
        return checkpoint.gather_full(self.model, self.model_cfg.swiglu)

    def push_weights(self, pusher, version: str | None = None) -> dict:
        """Collective: stream the weights into an engine bucket by bucket, resharded (``gyre_hpc.train.reshard``;
        ``pusher`` on the sender rank, None on the others); memory per rank bounded by ``train.weight_bucket_mb``."""
        from gyre_hpc.train.reshard import push_resharded

        return push_resharded(self.model, self.model_cfg, pusher, str(self.version if version is None else version),
                              int(self.cfg.weight_bucket_mb * 2**20))

    def publish_weights(self, publisher):
        """Collective: the full megatron weights into ``publisher``'s transfer buffer (sender: TP 0 of stage 0;
        None on the other ranks), bucket by bucket (``gyre_hpc.train.reshard.publish_resharded``); returns the
        descriptor on the sender, None elsewhere."""
        from gyre_hpc.train.reshard import publish_resharded

        if moe.ep_rank_size()[1] > 1:  # the buckets are planned per TP/PP shard, not per expert-parallel rank
            full = self.export_weights()
            return None if publisher is None else publisher.publish({k: v.numpy() for k, v in full.items()},
                                                                    version=self.version)
        return publish_resharded(self.model, self.model_cfg, publisher, self.version,
                                 int(self.cfg.weight_bucket_mb * 2**20))[0]

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write model, optimizer and version to the directory ``path`` atomically."""
        from megatron.core import parallel_state as ps

        meta = {"version": self.version, "tensor_parallel": ps.get_tensor_model_parallel_world_size(),
                "distributed_optimizer": self.sharded is not None, "expert_parallel": moe.ep_rank_size()[1]}
        return checkpoint.save(path, self.state_dict(), meta)

    def load_checkpoint(self, path: str | Path) -> None:
        """Model, optimizer and version from ``path``; one written under another layout (tensor-parallel size,
        workers) is merged and re-cut into this rank's shards (``checkpoint.load_resharded``)."""
        from megatron.core import parallel_state as ps

        world = dist.get_world_size() if dist.is_initialized() else 1
        here = (world, ps.get_tensor_model_parallel_world_size(), self.sharded is not None)
        checkpoint.check_expert_parallel(path, moe.ep_rank_size()[1])
        if checkpoint.layout_of(path) != here:  # another layout, or moments sharded one way and read the other
            self.load_state_dict(checkpoint.load_resharded(path, self.model, self.model_cfg.swiglu))
            return
        state, _ = checkpoint.load(path)
        self.load_state_dict(state)
