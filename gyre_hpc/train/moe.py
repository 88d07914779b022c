"""Mixture-of-experts (Qwen3-MoE) on megatron-core: the MoE config, expert names across expert-parallel ranks,
and the gradient bookkeeping of expert parallelism inside the trainer's world.

The model (``ModelConfig.experts > 0``): every decoder layer's MLP is megatron's ``MoELayer`` with the local spec's
``SequentialMLP`` experts (one SwiGLU MLP of ``moe_ffn`` per expert) and a softmax top-k router without bias:

- ``norm_topk`` true (Hugging Face ``norm_topk_prob``): megatron's ``moe_router_pre_softmax: false`` (top-k of the
  logits, then softmax over those k), which equals softmax → top-k → divide by the sum of the k;
- ``norm_topk`` false: ``moe_router_pre_softmax: true`` (softmax over all experts, then top-k, unnormalised).

No auxiliary loss, no token dropping, no capacity factor, float32 router: the layer computes exactly Hugging Face's
``Qwen3MoeSparseMoeBlock``. The token dispatcher is ``allgather`` (megatron's ``alltoall`` creates a CUDA stream at
construction and cannot run on a CPU).

Expert parallelism (``train.expert_parallel`` = EP): megatron's expert-parallel group holds EP ranks, rank ``r``
holding global experts ``r * E/EP .. (r+1) * E/EP - 1`` as ``local_experts.0 ..``. The trainer feeds every rank of
the group the same rows (as it does for tensor parallelism): the all-gather dispatcher then hands each expert every
token EP times, so an expert's gradient is EP times the gradient of the step's loss; ``unreplicate_expert_grads``
divides it back, and ``expert_grad_sq`` adds the experts of the other ranks to the global gradient norm. The trainer's data-parallel split of the micro-batches
is off while EP > 1 (``check_world``: the world is exactly the expert-parallel group), since the dispatcher's
all-gather needs every rank in every forward.

Invariants (tests/integration/test_moe.py)
- ``global_name(local_name(n, r, k), r, k) == n`` for every expert tensor ``n`` rank ``r`` holds; non-expert names
  are unchanged.
- EP 2 gives the loss, gradient norm and updated parameters of EP 1 within 1e-5 relative (float32, gloo).
- A router without expert bias never calls ``torch.compile`` (``skip_expert_bias``).
- ``apply_compat`` only fills a name megatron-core 0.16.1 leaves undefined without TransformerEngine
  (``moe_utils.te_general_gemm``), so the router's plain ``torch.mm`` path runs; with TE installed it does nothing.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from gyre_hpc.config import ModelConfig, TrainConfig

#: a megatron expert tensor: decoder.layers.{i}.mlp.experts.local_experts.{e}.<rest>
EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def apply_compat() -> None:
    """Make megatron-core's MoE router run without TransformerEngine (see the module docstring)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _no_expert_bias(routing_map, padding_mask=None) -> None:
    return None


def skip_expert_bias(model: torch.nn.Module) -> None:
    """Replace each router's ``_apply_expert_bias`` (a ``@jit_fuser`` function: ``torch.compile`` at its first
    call, ~20 s of importing and compiling inductor, in the middle of a live run's first step) by a no-op where it
    is one: without ``moe_router_enable_expert_bias`` it changes nothing."""
    from megatron.core.transformer.moe.router import TopKRouter

    for module in model.modules():
        if isinstance(module, TopKRouter) and not module.enable_expert_bias:
            module._apply_expert_bias = _no_expert_bias


def megatron_kwargs(cfg: ModelConfig) -> dict:
    """The ``TransformerConfig`` fields of the MoE model ``cfg`` (a ``ModelConfig`` with ``experts > 0``)."""
    from megatron.core import parallel_state as ps

    return dict(
        num_moe_experts=cfg.experts,
        moe_router_topk=cfg.experts_topk,
        moe_ffn_hidden_size=cfg.moe_ffn,
        moe_router_pre_softmax=not cfg.norm_topk,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_router_dtype="fp32",
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        expert_model_parallel_size=ps.get_expert_model_parallel_world_size(),
    )


def check_world(model_cfg: ModelConfig, train_cfg: TrainConfig) -> None:
    """The trainer's world fits the config: its expert-parallel group has ``train.expert_parallel`` ranks, and
    a MoE model trains with tensor parallel 1; else a ``ConfigError`` naming the key."""
    from megatron.core import parallel_state as ps

    from gyre_hpc.errors import ConfigError

    _, size = ep_rank_size()
    if size != train_cfg.expert_parallel:
        raise ConfigError(f"train.expert_parallel: {train_cfg.expert_parallel}, but the training world's "
                          f"expert-parallel group has {size} rank(s)")
    if model_cfg.experts and ps.get_tensor_model_parallel_world_size() > 1:
        raise ConfigError(f"model.experts: {model_cfg.experts} with tensor parallel "
                          f"{ps.get_tensor_model_parallel_world_size()}: a MoE model trains with tensor parallel 1")
    if size > 1 and ps.get_data_parallel_world_size() != size:
        raise ConfigError(f"train.expert_parallel: {size} in a training world of {ps.get_data_parallel_world_size()} "
                          f"data-parallel ranks: expert parallel replicates the rows over its group, so the world "
                          f"must be exactly the expert-parallel group (tensor parallel 1)")
    if model_cfg.experts and model_cfg.experts % size:
        raise ConfigError(f"train.expert_parallel: {size} does not divide model.experts={model_cfg.experts}")


def is_expert(name: str) -> bool:
    return EXPERT.match(name) is not None


def ep_rank_size() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size()


def global_name(name: str, rank: int, local_experts: int) -> str:
    """The full-model name of this rank's tensor ``name`` (``local_experts.{j}`` → global expert index)."""
    m = EXPERT.match(name)
    return name if m is None else f"{m[1]}{rank * local_experts + int(m[2])}{m[3]}"


def local_name(name: str, rank: int, local_experts: int) -> str | None:
    """This rank's name for the full-model tensor ``name``; None when another rank holds that expert."""
    m = EXPERT.match(name)
    if m is None:
        return name
    e = int(m[2]) - rank * local_experts
    return f"{m[1]}{e}{m[3]}" if 0 <= e < local_experts else None


def to_local(full: dict, experts: int) -> dict:
    """The entries of the full-model tensors ``full`` this expert-parallel rank holds, under its own names."""
    rank, size = ep_rank_size()
    if experts == 0 or size == 1:
        return dict(full)
    out = {}
    for name, t in full.items():
        mine = local_name(name, rank, experts // size)
        if mine is not None:
            out[mine] = t
    return out


def gather_experts(local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full-model tensors from this rank's ``local`` ones: expert tensors all-gathered over the expert-parallel
    group and renamed to global indices (a collective when EP > 1; every rank returns the whole model)."""
    held = {int(m[2]) for m in map(EXPERT.match, local) if m is not None}
    if not held:
        return local
    rank, size = ep_rank_size()
    if size == 1:
        return local
    from megatron.core import parallel_state as ps

    per = max(held) + 1
    out = {}
    for name, t in local.items():
        if not is_expert(name):
            out[name] = t
            continue
        shards = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(shards, t.contiguous(), group=ps.get_expert_model_parallel_group())
        for r, s in enumerate(shards):
            out[global_name(name, r, per)] = s
    return out


def gather_expert_grads(model: torch.nn.Module, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``gather_experts`` for gradients: an expert no token was routed to has none on its rank, so every rank first
    fills zeros for its missing experts (the all-gathers pair tensors by order), then the experts that had no
    gradient on their rank are left out, as a one-rank trainer leaves them out (a collective when EP > 1)."""
    rank, size = ep_rank_size()
    if size == 1:
        return grads
    from megatron.core import parallel_state as ps

    params = dict(model.named_parameters())
    experts = [n for n in params if is_expert(n)]
    missing = [n for n in experts if n not in grads]
    full = {n: grads[n] if n in grads else torch.zeros_like(params[n]) for n in params if n in grads or is_expert(n)}
    every: list = [None] * size
    dist.all_gather_object(every, missing, group=ps.get_expert_model_parallel_group())
    per = len({int(EXPERT.match(n)[2]) for n in experts})
    absent = {global_name(n, r, per) for r, names in enumerate(every) for n in names}
    return {k: v for k, v in gather_experts(full).items() if k not in absent}


def global_shapes(local: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Shapes by full-model name from this rank's (every expert-parallel rank holds as many experts, alike)."""
    rank, size = ep_rank_size()
    held = {int(m[2]) for m in map(EXPERT.match, local) if m is not None}
    if size == 1 or not held:
        return dict(local)
    per = max(held) + 1
    return {global_name(n, r, per): shape for n, shape in local.items()
            for r in (range(size) if is_expert(n) else (0,))}


def unreplicate_expert_grads(model: torch.nn.Module) -> None:
    """Divide every expert gradient by EP (each rank fed the same rows; see the module docstring)."""
    _, size = ep_rank_size()
    if size == 1:
        return
    for name, p in model.named_parameters():
        if p.grad is not None and is_expert(name):
            p.grad.div_(size)


def expert_grad_sq(model: torch.nn.Module, device) -> torch.Tensor:
    """Sum of squared expert gradients over all expert-parallel ranks (float64; a collective when EP > 1)."""
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for name, p in model.named_parameters():
        if p.grad is not None and is_expert(name):
            sq += p.grad.detach().double().pow(2).sum()
    _, size = ep_rank_size()
    if size > 1:
        from megatron.core import parallel_state as ps

        dist.all_reduce(sq, group=ps.get_expert_model_parallel_group())
    return sq
