"""The policy model: megatron-core ``GPTModel`` with the local layer spec, and the process set-up it needs.

Invariants
- ``build_model(cfg, seed)`` is deterministic: the same config and seed give bit-identical parameters, for any
  tensor-parallel size (weights are initialised on the CPU as full master tensors, then split). With
  ``cfg.hf_path`` the parameters are that checkpoint's (``gyre_hpc.train.hf_weights``), whatever the seed.
- ``forward_logits`` returns full-vocabulary logits ``[b, s, V]`` (gathered across tensor-parallel ranks) and
  honours the given ``position_ids`` for every position-embedding type offered (``mrope`` gets three identical
  rows, which equals RoPE at those positions).
- ``forward_hidden`` + ``output_logits`` compute what ``forward_logits`` does, split at the output layer (the
  chunked loss runs the output layer over a few positions at a time); ``enable_recompute`` changes no value.
- ``init_parallel`` initialises torch.distributed (gloo on the CPU, nccl on CUDA) and megatron's model-parallel
  groups once per process; calling it again with the same geometry is a no-op, with another geometry an error.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import torch
import torch.distributed as dist

from gyre_hpc.config import ModelConfig
from gyre_hpc.train import cpu_compat, moe


def init_parallel(
    world_size: int = 1, rank: int = 0, tensor_parallel: int = 1, master_port: int | None = None, seed: int = 0,
    master_addr: str = "127.0.0.1", store=None, expert_parallel: int = 1,
) -> None:
    """Join a ``world_size`` process group met at ``master_addr:master_port`` (or through ``store``, a
    torch.distributed store the caller made: no port to race for) and build megatron's groups (TP
    ``tensor_parallel``, EP ``expert_parallel``; data parallel: the rest)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    cpu_compat.apply()
    # megatron's tensor-parallel gathers call a torch API that warns on every call (nothing for us to act on)
    warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.*is deprecated", category=FutureWarning)
    if ps.model_parallel_is_initialized():
        have = (dist.get_world_size(), ps.get_tensor_model_parallel_world_size())
        if have != (world_size, tensor_parallel) or ps.get_expert_model_parallel_world_size() != expert_parallel:
            raise RuntimeError(f"model parallel already initialised as (world, tp)={have}, "
                               f"ep={ps.get_expert_model_parallel_world_size()}")
        return
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        if store is not None:
            dist.init_process_group(backend, store=store, world_size=world_size, rank=rank)
        elif world_size == 1 and master_port is None:
            # a one-process world needs no rendezvous: an in-memory store binds no port (no EADDRINUSE races)
            dist.init_process_group(backend, store=dist.HashStore(), world_size=1, rank=0)
        else:
            os.environ["MASTER_ADDR"] = master_addr
            if master_port is not None:
                os.environ["MASTER_PORT"] = str(master_port)
            dist.init_process_group(backend, world_size=world_size, rank=rank)
    ps.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel, expert_model_parallel_size=expert_parallel)
    model_parallel_cuda_manual_seed(seed)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transformer_config(cfg: ModelConfig):
    """megatron's ``TransformerConfig`` for ``cfg`` (no dropout, no biases, fp32, CPU initialisation)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_config import TransformerConfig

    head_dim = cfg.head_dim or cfg.hidden // cfg.heads
    half = head_dim // 2
    mrope_section = [half - 2 * (half // 3), half // 3, half // 3]  # any split works: the three rows are equal
    return TransformerConfig(
        num_layers=cfg.layers,
        hidden_size=cfg.hidden,
        num_attention_heads=cfg.heads,
        num_query_groups=cfg.kv_heads,
        ffn_hidden_size=cfg.ffn,
        normalization=cfg.normalization,
        gated_linear_unit=cfg.swiglu,
        activation_func=torch.nn.functional.silu if cfg.swiglu else torch.nn.functional.gelu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size(),
        mrope_section=mrope_section if cfg.position_embedding == "mrope" else None,
        kv_channels=head_dim,
        qk_layernorm=cfg.qk_layernorm,
        add_qkv_bias=cfg.qkv_bias,
        layernorm_epsilon=cfg.norm_eps,
        **(moe.megatron_kwargs(cfg) if cfg.experts else {}),
    )


@contextlib.contextmanager
def quiet_megatron():
    """Silence megatron-core's import/construction warnings (missing Apex/TE, deprecations we cannot act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"megatron\.")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield


def build_model(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """A megatron-core ``GPTModel`` (local spec) on this process's device, in the current model-parallel world
    (``init_parallel``); starts a 1-process world when none exists."""
    with quiet_megatron():
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        if not ps.model_parallel_is_initialized():
            init_parallel(seed=seed)
        torch.manual_seed(seed)
        spec = get_gpt_layer_local_spec(num_experts=cfg.experts or None, normalization=cfg.normalization,
                                        qk_layernorm=cfg.qk_layernorm)
        if cfg.experts:
            moe.apply_compat()
        if cfg.attention in ("sdpa", "tree"):
            from gyre_hpc.train.attention import SDPAttention, TreeAttention

            core = SDPAttention if cfg.attention == "sdpa" else TreeAttention
            spec.submodules.self_attention.submodules.core_attention = core
        model = GPTModel(
            config=transformer_config(cfg),
            transformer_layer_spec=spec,
            vocab_size=cfg.vocab_size,
            max_sequence_length=cfg.max_seq_len,
            position_embedding_type=cfg.position_embedding,
            rotary_base=cfg.rotary_base,
            share_embeddings_and_output_weights=cfg.tie_embeddings,
        )
    if cfg.experts:
        moe.skip_expert_bias(model)
    if cfg.hf_path is not None:
        from gyre_hpc.train.hf_weights import load_hf_weights

        load_hf_weights(model, cfg)
    if torch.cuda.is_available():
        model.cuda()
    return model


def forward_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Full-vocabulary logits ``[b, s, V]``; ``attention_mask`` is bool ``[b, 1, s, s]``, True = masked, or (with
    ``model.attention: tree``) the rows' int ``span_end`` ``[b, s]`` (``gyre_hpc.train.attention.TreeAttention``)."""
    pos = position_ids
    if getattr(model, "position_embedding_type", None) == "mrope":
        pos = position_ids.unsqueeze(0).expand(3, -1, -1)
    with quiet_megatron():
        return model(input_ids, pos, attention_mask, labels=None, runtime_gather_output=True)


def forward_hidden(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The final hidden states ``[s, b, h]`` (after the final norm), before the output layer: ``forward_logits``
    without its logits, for a loss that runs the output layer in chunks (``output_logits``)."""
    pos = position_ids
    if getattr(model, "position_embedding_type", None) == "mrope":
        pos = position_ids.unsqueeze(0).expand(3, -1, -1)
    post, model.post_process = model.post_process, False  # GPTModel returns the decoder's output then
    try:
        with quiet_megatron():
            return model(input_ids, pos, attention_mask, labels=None)
    finally:
        model.post_process = post


def output_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits ``[n, V]`` of hidden states ``[n, h]`` (gathered across tensor-parallel ranks)."""
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    with quiet_megatron():
        logits, _ = model.output_layer(hidden.unsqueeze(1), weight=weight, runtime_gather_output=True)
    return logits.squeeze(1)


def enable_recompute(model: torch.nn.Module) -> None:
    """Activation recomputation (``train.recompute``): every transformer layer runs under
    ``torch.utils.checkpoint`` (non-reentrant), keeping only its inputs; the backward recomputes it. The model
    has no dropout, so the recomputation is exact; CPU and CUDA alike. Idempotent."""
    from torch.utils.checkpoint import checkpoint

    for layer in model.decoder.layers:
        if getattr(layer, "_gyre_recompute", False):
            continue
        inner = layer.forward

        def forward(*args, _inner=inner, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
        layer._gyre_recompute = True
