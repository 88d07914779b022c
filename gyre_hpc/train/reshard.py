"""Weights resharded on their way: the trainer's TP/PP shards → full engine tensors, bucket by bucket.

A trainer of TP x PP ranks (data-parallel replica 0; the other replicas hold copies and take no part) hands its
weights to an engine of any TP size without any rank holding the whole model::

    plan (once, every rank):  metadata of every stage's tensors (all_gather_object: names, full shapes, dtypes)
                              → global megatron names in export order → buckets of <= bucket_bytes full bytes
    per bucket b (collective over the model-parallel group, in plan order):
      stage s, TP ranks 0..T-1   gather(shard, dst=TP rank 0)  → full tensor on stage s's TP rank 0
                                 (SwiGLU linear_fc1: [gate_r; up_r] re-ordered to [gate; up])
      stage s's TP rank 0 (s>0)  send(full)  ────────▶  sender (TP 0 of stage 0) recv
      sender                     megatron → HF (split q/k/v per query group, gate/up) → one engine bucket
                                 POST /update_weights_from_distributed {bucket's names}; broadcast its tensors
      every rank                 drops the bucket's full tensors before the next bucket

The engine receives full Hugging Face tensors and shards them for its own TP itself (SGLang's loaders do), so the
trainer's layout and the engine's are independent.

Invariants (tests/integration/test_reshard.py)
- ``plan_buckets``: every exported tensor is in exactly one bucket, buckets keep the export order, and a bucket's
  full bytes are <= ``bucket_bytes`` unless it is a single tensor larger than that (alone in its bucket). The HF
  parts of one megatron tensor (q/k/v, gate/up) always travel in the same bucket.
- The union of the sender's buckets equals ``to_hf(gather_full(model))`` of the same weights bit for bit, for any
  TP and PP; other ranks yield nothing but take part in every bucket's collectives, in the same order.
- No rank holds more than one bucket's full tensors at a time: ``ReshardStats.max_bucket_bytes`` (the largest sum of
  full tensors a rank materialised for one bucket) is <= ``bucket_bytes`` whenever no single tensor exceeds it.
- ``push_resharded`` retries collectively: a failed push on the sender still drains every bucket's collectives,
  the outcome is broadcast, and all ranks redo the stream together (``1 + retries`` attempts, then
  ``WeightSyncError`` on every rank).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from gyre_hpc.config import ModelConfig

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Entry:
    """One exported tensor: its global megatron ``name``, the owning stage's ``local`` state-dict key, the full
    (un-sharded) shape and its bytes, and how TP splits it (``partition_dim`` None: replicated)."""

    name: str
    local: str
    stage: int
    shape: tuple[int, ...]
    dtype: str
    partition_dim: int | None
    fc1: bool  # SwiGLU linear_fc1: each TP rank holds [gate_r; up_r]

    @property
    def nbytes(self) -> int:
        n = getattr(torch, self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass
class ReshardStats:
    """What one rank did in one stream: buckets, full bytes it materialised (largest bucket, total)."""

    buckets: int = 0
    max_bucket_bytes: int = 0
    bytes: int = 0
    per_bucket: list[int] = field(default_factory=list)


def plan_buckets(entries: list[Entry], bucket_bytes: int) -> list[list[Entry]]:
    """Greedy buckets in order: a bucket closes before the tensor that would take it over ``bucket_bytes``; a
    tensor larger than that is a bucket on its own (pure)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[Entry]] = []
    size = 0
    for e in entries:
        if not buckets or size + e.nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(e)
        size += e.nbytes
    return buckets


# ------------------------------------------------------------------------------------------------ groups
def _groups():
    """(tp, tp rank, tp group, pp rank, pipeline ranks (global, this rank's TP/DP position), mp group,
    takes part: data-parallel replica 0)."""
    from megatron.core import parallel_state as ps

    pp_group = ps.get_pipeline_model_parallel_group()
    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_rank(),
            dist.get_process_group_ranks(pp_group), ps.get_model_parallel_group(),
            ps.get_data_parallel_rank() == 0)


def _layer_offset(model: torch.nn.Module) -> int:
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    return int(layers[0].layer_number) - 1 if layers is not None and len(layers) else 0


def local_entries(model: torch.nn.Module, swiglu: bool, stage: int, tp: int) -> list[Entry]:
    """This stage's exported tensors with global names (layer index + the stage's offset) and full shapes."""
    params = dict(model.named_parameters())
    offset = _layer_offset(model)
    out = []
    for key, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            continue
        name = _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", key)
        p = params.get(key)
        dim = p.partition_dim if (tp > 1 and p is not None and getattr(p, "tensor_model_parallel", False)) else None
        shape = list(value.shape)
        if dim is not None:
            shape[dim] *= tp
        out.append(Entry(name, key, stage, tuple(shape), str(value.dtype).removeprefix("torch."), dim,
                         swiglu and name.endswith("mlp.linear_fc1.weight")))
    return out


def export_entries(model: torch.nn.Module, cfg: ModelConfig, engine_names: bool = True) -> list[Entry]:
    """Every stage's entries, in export order (collective over the model-parallel group): the HF table's order
    when sending engine names of a model with an HF form (tensors outside it, e.g. a tied output layer's copy,
    are not sent), else stage by stage in state-dict order (first stage wins a name)."""
    from gyre_hpc.train.hf_weights import entries, has_hf_form as hf_names

    tp, tp_rank, _, stage, _, mp_group, _ = _groups()
    mine = local_entries(model, cfg.swiglu, stage, tp) if tp_rank == 0 else []
    world = dist.get_world_size(mp_group) if dist.is_initialized() else 1
    everyone: list = [None] * world
    if world > 1:
        dist.all_gather_object(everyone, mine, group=mp_group)
    else:
        everyone = [mine]
    by_name: dict[str, Entry] = {}
    for part in everyone:
        for e in part:
            by_name.setdefault(e.name, e)
    if engine_names and hf_names(cfg):
        order = [m for m, _, _ in entries(cfg)]
        return [by_name[m] for m in order if m in by_name]
    if cfg.tie_embeddings:  # the last stage's copy of the tied embedding is not a weight of its own
        by_name.pop("output_layer.weight", None)
    return list(by_name.values())


# ------------------------------------------------------------------------------------------------ buckets
def _full(model_state: Mapping[str, torch.Tensor], e: Entry, tp: int, tp_rank: int, tp_group) -> torch.Tensor | None:
    """The full tensor on this stage's TP rank 0, on the model's device (None on the others); a collective over
    the TP group (NCCL moves device tensors only: nothing goes through the host here)."""
    shard = model_state[e.local].detach()
    if e.partition_dim is None:
        return shard if tp_rank == 0 else None
    dst = dist.get_global_rank(tp_group, 0)
    shards = [torch.empty_like(shard) for _ in range(tp)] if tp_rank == 0 else None
    dist.gather(shard.contiguous(), shards, dst=dst, group=tp_group)
    if tp_rank != 0:
        return None
    if e.fc1:
        halves = [s.chunk(2, dim=0) for s in shards]
        shards = [h[0] for h in halves] + [h[1] for h in halves]
    return torch.cat(shards, dim=e.partition_dim)


def _engine_parts(name: str, full: torch.Tensor, rows: dict, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """One megatron tensor → its engine tensors (HF names and layout, or itself under its megatron name)."""
    from gyre_hpc.train.hf_weights import split_qkv

    if name not in rows:
        return {name: full.contiguous()}
    hnames, layout = rows[name]
    parts = split_qkv(full, cfg) if layout == "qkv" else full.chunk(2, dim=0) if layout == "gate_up" else (full,)
    return {h: p.contiguous() for h, p in zip(hnames, parts)}


def iter_buckets(model: torch.nn.Module, cfg: ModelConfig, bucket_bytes: int, stats: ReshardStats | None = None,
                 engine_names: bool = True, plan: list[list[Entry]] | None = None
                 ) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
    """Collective generator over the model-parallel group of data-parallel replica 0 (other replicas: nothing).
    The sender (TP rank 0 of stage 0) yields ``(engine tensors, last)`` per bucket; every other rank yields
    nothing but must exhaust the generator (it runs the bucket's gathers and sends). ``engine_names`` false: full
    megatron tensors under their global names (what ``gather_full`` gives, what satellites load)."""
    from gyre_hpc.train.hf_weights import entries, has_hf_form as hf_names

    stats = stats if stats is not None else ReshardStats()
    tp, tp_rank, tp_group, stage, pp_ranks, _, takes_part = _groups()
    if not takes_part:
        return
    plan = plan if plan is not None else plan_buckets(export_entries(model, cfg, engine_names), bucket_bytes)
    rows = {m: (h, lay) for m, h, lay in entries(cfg)} if engine_names and hf_names(cfg) else {}
    state = model.state_dict()
    device = next(model.parameters()).device
    sender = stage == 0 and tp_rank == 0
    for index, bucket in enumerate(plan):
        held: dict[str, torch.Tensor] = {}
        for e in bucket:
            if e.stage == stage:
                full = _full(state, e, tp, tp_rank, tp_group)
                if full is not None and not sender:
                    dist.send(full, dst=pp_ranks[0])
                elif full is not None:
                    held[e.name] = full
            elif sender:
                buf = torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=device)
                dist.recv(buf, src=pp_ranks[e.stage])
                held[e.name] = buf
        if sender:
            nbytes = sum(e.nbytes for e in bucket)
        else:  # a later stage's TP rank 0 holds each full tensor only until it is sent; other TP ranks none
            nbytes = max((e.nbytes for e in bucket if e.stage == stage and tp_rank == 0), default=0)
        stats.buckets += 1
        stats.bytes += nbytes
        stats.per_bucket.append(nbytes)
        stats.max_bucket_bytes = max(stats.max_bucket_bytes, nbytes)
        if sender:
            out: dict[str, torch.Tensor] = {}
            for name in list(held):
                out.update(_engine_parts(name, held.pop(name), rows, cfg))
            yield out, index == len(plan) - 1


def gather_engine_tensors(model: torch.nn.Module, cfg: ModelConfig, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """Every bucket merged (the sender gets the whole model; others an empty dict): a check and a baseline."""
    out: dict[str, torch.Tensor] = {}
    for tensors, _ in iter_buckets(model, cfg, bucket_bytes):
        out.update(tensors)
    return out


def push_resharded(model: torch.nn.Module, cfg: ModelConfig, pusher, version: str, bucket_bytes: int,
                   retries: int = 2) -> dict:
    """Collective: stream the model's buckets into ``pusher``'s engine (``WeightPusher``, on the sender only;
    None elsewhere). Returns the sender's push stats (others: their ``ReshardStats``) with ``max_bucket_bytes``."""
    from gyre_hpc.errors import WeightSyncError

    _, _, _, _, _, mp_group, takes_part = _groups()
    if not takes_part:
        return {"buckets": 0, "max_bucket_bytes": 0}
    mp = dist.get_world_size(mp_group) if dist.is_initialized() else 1
    errors: list[str] = []
    for attempt in range(1 + retries):
        stats = ReshardStats()
        stream = iter_buckets(model, cfg, bucket_bytes, stats)
        result, error = {}, None
        if pusher is not None:
            try:
                result = pusher.push_stream(stream, str(version))
            except Exception as exc:  # noqa: BLE001 - reported on every rank below
                error = f"attempt {attempt}: {exc}"
                pusher.reset()
            for _ in stream:  # drain: the other ranks run every bucket's collectives
                pass
        else:
            for _ in stream:
                pass
        flag = [error]
        if mp > 1:
            dist.broadcast_object_list(flag, src=dist.get_global_rank(mp_group, 0), group=mp_group)
        if flag[0] is None:
            return {**result, "buckets": stats.buckets, "max_bucket_bytes": stats.max_bucket_bytes,
                    "attempt": attempt}
        errors.append(flag[0])
    raise WeightSyncError(f"weight version {version} not pushed after {1 + retries} attempts: " + " | ".join(errors),
                          endpoint="/update_weights_from_distributed")


def publish_resharded(model: torch.nn.Module, cfg: ModelConfig, publisher, version: int,
                      bucket_bytes: int) -> tuple[object, ReshardStats]:
    """Collective: the full megatron weights into ``publisher``'s transfer buffer (Mooncake for satellites and
    rollout cells; ``publisher`` on the sender, None elsewhere), filled bucket by bucket
    (``BufferPublisher.publish_stream``). The buffer itself holds the whole model: it is what pullers read, one
    descriptor and one manifest of checksums per version; what the buckets save is every other full copy (no
    ``export_weights`` dict next to it). Returns (the descriptor on the sender, else None; this rank's stats)."""
    stats = ReshardStats()
    plan = plan_buckets(export_entries(model, cfg, engine_names=False), bucket_bytes)
    stream = iter_buckets(model, cfg, bucket_bytes, stats, engine_names=False, plan=plan)
    if publisher is None:
        for _ in stream:
            pass
        return None, stats
    specs = [(e.name, torch.empty(0, dtype=getattr(torch, e.dtype)).numpy().dtype, e.shape) for b in plan for e in b]
    try:
        desc = publisher.publish_stream(specs, ({k: v.cpu().numpy() for k, v in t.items()} for t, _ in stream),
                                        version)
    finally:
        for _ in stream:  # on an error, the other ranks still run every bucket's collectives
            pass
    return desc, stats

