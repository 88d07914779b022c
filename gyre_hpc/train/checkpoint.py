"""Atomic checkpoints and weight export of a (possibly tensor-parallel) megatron model.

Layout of a checkpoint directory::

    <path>/meta.json                   {"version": ..., "tensor_parallel": ..., "world_size": ...,
                                        "distributed_optimizer": ...}
    <path>/rank000.safetensors ...     each rank's model tensors (safetensors: no code in the file format)
    <path>/rank000.state.pt ...        the rest of its Trainer.state_dict(): optimizer state, version, the model's
                                       non-tensor entries; plain tensors, numbers, strings, lists and dicts only,
                                       read with ``torch.load(weights_only=True)``

Invariants
- A checkpoint directory appears only complete: every rank writes into one temporary sibling directory
  (``gyre_hpc.files.io.atomic_dir``, created by rank 0), which rank 0 renames to ``<path>`` after all ranks finished.
  A process killed or failing while saving leaves at most the temporary sibling, never a partial ``<path>``,
  and an older checkpoint at ``<path>`` stays intact until the new one replaces it whole.
- ``gather_full`` returns each parameter as the single-rank model would hold it: tensor-parallel shards are
  gathered along ``partition_dim``, and SwiGLU ``linear_fc1`` shards ([gate_r; up_r]) are re-ordered to
  [gate; up]; expert-parallel experts are gathered and named by their global index (``gyre_hpc.train.moe``).
- Written under ``train.distributed_optimizer`` a moment is in its owner's rank file only (``train.zero``);
  ``load_resharded`` takes each moment from the replica that holds it, so such a checkpoint resumes under any
  layout, sharded or not.
- Nothing in a checkpoint is unpickled with arbitrary globals: a file that holds any other object (a planted
  pickle with a ``__reduce__`` payload) is refused with a ``CheckpointError`` before any of it runs
  (tests/integration/test_checkpoint_hostile.py).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
import torch.distributed as dist

from gyre_hpc.errors import CheckpointError
from gyre_hpc.files.io import atomic_dir
from gyre_hpc.train import moe


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save(path: str | Path, state: dict, meta: dict) -> Path:
    """Write this rank's ``state`` into the checkpoint directory ``path`` atomically (collective call)."""
    path = Path(path)
    rank, world = _rank_world()
    with contextlib.ExitStack() as stack:
        tmp = [stack.enter_context(atomic_dir(path)) if rank == 0 else None]
        if world > 1:
            dist.broadcast_object_list(tmp, src=0)
        _write_rank(tmp[0], rank, state)
        _barrier()
        if rank == 0:
            (tmp[0] / "meta.json").write_text(json.dumps({**meta, "world_size": world}, indent=1))
    _barrier()
    return path


def load(path: str | Path) -> tuple[dict, dict]:
    """This rank's state and the checkpoint's meta; a missing or mismatched checkpoint is a ``CheckpointError``."""
    path = Path(path)
    rank, world = _rank_world()
    meta = read_meta(path)
    if meta.get("world_size") != world:
        raise CheckpointError(f"{path}: saved by {meta.get('world_size')} ranks, loading with {world}")
    return _read_rank(path, rank), meta


#: megatron name suffix -> the dimension tensor parallelism splits (the local spec's parallel layers)
TP_DIM = {"word_embeddings.weight": 0, "output_layer.weight": 0, "linear_qkv.weight": 0, "linear_qkv.bias": 0,
          "linear_fc1.weight": 0, "linear_proj.weight": 1, "linear_fc2.weight": 1}


def merge_shards(name: str, shards: list[torch.Tensor], swiglu: bool) -> torch.Tensor:
    """One tensor of the single-rank model from its tensor-parallel shards (rank order; ``TP_DIM``)."""
    dim = next((d for suffix, d in TP_DIM.items() if name.endswith(suffix)), None)
    if dim is None or len(shards) == 1:
        return shards[0]
    if swiglu and name.endswith("mlp.linear_fc1.weight"):
        halves = [s.chunk(2, dim=0) for s in shards]
        shards = [h[0] for h in halves] + [h[1] for h in halves]
    return torch.cat(shards, dim=dim)


def merge_tp(ranks: list[dict[str, torch.Tensor]], swiglu: bool) -> dict[str, torch.Tensor]:
    """Full tensors from the per-rank state dicts of one tensor-parallel group (rank order)."""
    return {name: merge_shards(name, [r[name] for r in ranks], swiglu)
            for name, first in ranks[0].items() if isinstance(first, torch.Tensor)}


def load_resharded(path: str | Path, model: torch.nn.Module, swiglu: bool) -> dict:
    """This rank's ``Trainer.state_dict()`` from a checkpoint written under another layout (another tensor-parallel
    size or number of workers, moments sharded or not): the first tensor-parallel group's files are merged into the
    single-rank model's tensors, each moment from the data-parallel replica that holds it (all of them, unless the
    writer sharded its optimizer: ``gyre_hpc.train.zero``), then cut into this rank's shards (``local_shard``)."""
    path = Path(path)
    world, tp, sharded = layout_of(path)
    replicas = [[_read_rank(path, d * tp + t) for t in range(tp)] for d in range(world // tp if sharded else 1)]
    saved = replicas[0]
    params = dict(model.named_parameters())
    names = [n for n, p in params.items() if p.requires_grad]  # the optimizer's parameter order
    full = merge_tp([s["model"] for s in saved], swiglu)
    weights = {k: local_shard(params[k], k, v, swiglu) if k in params else v for k, v in full.items()}
    extra = {k: v for k, v in saved[0]["model"].items() if not isinstance(v, torch.Tensor)}
    holder = {i: group for group in reversed(replicas) for i in group[0]["optimizer"]["state"]}  # first holder wins
    moments = {i: {k: (v if k == "step" else local_shard(params[names[i]], names[i], merge_shards(
        names[i], [s["optimizer"]["state"][i][k] for s in group], swiglu), swiglu))
        for k, v in group[0]["optimizer"]["state"][i].items()} for i, group in sorted(holder.items())}
    return {**{k: v for k, v in saved[0].items() if k not in ("model", "optimizer")},
            "model": {**weights, **extra}, "optimizer": {**saved[0]["optimizer"], "state": moments}}


def read_meta(path: str | Path) -> dict:
    """The checkpoint's meta.json; a directory without one is a ``CheckpointError``."""
    if not (Path(path) / "meta.json").is_file():
        raise CheckpointError(f"{path}: not a checkpoint directory (no meta.json)")
    return json.loads((Path(path) / "meta.json").read_text())


def check_expert_parallel(path: str | Path, ep: int) -> None:
    """A checkpoint resumes under the expert-parallel size that wrote it (its rank files hold that rank's experts):
    another is a ``CheckpointError`` naming both."""
    saved = read_meta(path).get("expert_parallel", 1)
    if saved != ep:
        raise CheckpointError(f"{path}: written under train.expert_parallel={saved}, resumed under {ep}: resume "
                              f"with train.expert_parallel={saved}")


def layout_of(path: str | Path) -> tuple[int, int, bool]:
    """(world size, tensor-parallel size, optimizer moments sharded over the replicas) a checkpoint was written
    with."""
    meta = read_meta(path)
    return (int(meta.get("world_size", 1)), int(meta.get("tensor_parallel", 1)),
            bool(meta.get("distributed_optimizer", False)))


def rank_files(path: str | Path, rank: int) -> list[Path]:
    """The files of rank ``rank`` in the checkpoint directory ``path`` (what a resume needs of it)."""
    from gyre_hpc.lifecycle.resume import RANK_FILES

    return [Path(path) / f.format(rank=rank) for f in RANK_FILES]


def _write_rank(directory: Path, rank: int, state: dict) -> None:
    from safetensors.torch import save_file

    model = state["model"]
    tensors, seen = {}, set()
    for k, v in model.items():
        if isinstance(v, torch.Tensor):
            v = v.detach().to("cpu").contiguous()
            ptr = (v.untyped_storage().data_ptr(), v.storage_offset())
            tensors[k] = v.clone() if ptr in seen else v  # safetensors refuses tensors that share memory
            seen.add(ptr)
    rest = {k: v for k, v in state.items() if k != "model"}
    rest["model_extra"] = {k: v for k, v in model.items() if not isinstance(v, torch.Tensor)}
    weights, other = rank_files(directory, rank)
    save_file(tensors, str(weights))
    torch.save(rest, other)


def _read_rank(path: Path, rank: int) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights, other = rank_files(path, rank)
    for f in (weights, other):
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (a checkpoint holds {weights.name} and {other.name} per rank)")
    try:
        model = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights}: not a safetensors file ({exc})") from None
    try:
        rest = torch.load(other, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the unpickler refuses with several types; none runs the payload
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{other}: refused (only tensors, numbers, strings, lists and dicts are read "
                              f"from a checkpoint): {first}") from None
    if not isinstance(rest, dict) or "version" not in rest:
        raise CheckpointError(f"{other}: not a checkpoint's state (a dict with the key 'version')")
    extra = rest.pop("model_extra", {}) or {}
    return {**rest, "model": {**model, **extra}}


def gather_full(model: torch.nn.Module, swiglu: bool) -> dict[str, torch.Tensor]:
    """Flat ``{name: full CPU tensor}`` of every tensor entry of ``model.state_dict()`` (collective under TP)."""
    state = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    return moe.gather_experts(gather_tensors(model, state, swiglu))


def gather_tensors(model: torch.nn.Module, tensors: dict[str, torch.Tensor], swiglu: bool) -> dict[str, torch.Tensor]:
    """``tensors`` (named like ``model``'s parameters: the values, or their gradients) as the single-rank model would
    hold them: tensor-parallel shards gathered along ``partition_dim`` (collective under TP), on the CPU."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    params = dict(model.named_parameters())
    out = {}
    for name, value in tensors.items():
        p = params.get(name)
        if tp > 1 and p is not None and getattr(p, "tensor_model_parallel", False):
            shards = [torch.empty_like(value) for _ in range(tp)]
            dist.all_gather(shards, value.contiguous(), group=ps.get_tensor_model_parallel_group())
            if swiglu and name.endswith("mlp.linear_fc1.weight"):
                halves = [s.chunk(2, dim=0) for s in shards]
                shards = [h[0] for h in halves] + [h[1] for h in halves]
            value = torch.cat(shards, dim=p.partition_dim)
        out[name] = value.detach().to("cpu", copy=True)
    return out


def local_shard(param: torch.Tensor, name: str, full: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """This tensor-parallel rank's part of ``full`` (a tensor as the single-rank model holds it) for ``param``:
    the inverse of ``gather_tensors`` (SwiGLU ``linear_fc1``: [gate_r; up_r])."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return full
    r, dim = ps.get_tensor_model_parallel_rank(), param.partition_dim
    if swiglu and name.endswith("mlp.linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[r], up.chunk(tp, dim=0)[r]], dim=0)
    return full.chunk(tp, dim=dim)[r]


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The shape the single-rank model gives ``param`` (its tensor-parallel partition dimension times TP)."""
    from megatron.core import parallel_state as ps

    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False) and ps.model_parallel_is_initialized():
        shape[param.partition_dim] *= ps.get_tensor_model_parallel_world_size()
    return tuple(shape)
