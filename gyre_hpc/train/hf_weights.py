"""The one mapping table between Hugging Face Qwen2/Qwen3 tensors and megatron-core ``GPTModel`` (local spec).

=========================================================  ==============================================  ========
megatron name                                              HF name(s) (``L`` = ``model.layers.{i}``)       layout
=========================================================  ==============================================  ========
embedding.word_embeddings.weight                           model.embed_tokens.weight                       copy
decoder.layers.{i}.input_layernorm.weight                  L.input_layernorm.weight                        copy
decoder.layers.{i}.self_attention.linear_qkv.weight        L.self_attn.{q,k,v}_proj.weight                 qkv
decoder.layers.{i}.self_attention.linear_qkv.bias          L.self_attn.{q,k,v}_proj.bias      (Qwen2)      qkv
decoder.layers.{i}.self_attention.q_layernorm.weight       L.self_attn.q_norm.weight          (Qwen3)      copy
decoder.layers.{i}.self_attention.k_layernorm.weight       L.self_attn.k_norm.weight          (Qwen3)      copy
decoder.layers.{i}.self_attention.linear_proj.weight       L.self_attn.o_proj.weight                       copy
decoder.layers.{i}.pre_mlp_layernorm.weight                L.post_attention_layernorm.weight               copy
decoder.layers.{i}.mlp.linear_fc1.weight                   L.mlp.{gate,up}_proj.weight        (dense)      gate_up
decoder.layers.{i}.mlp.linear_fc2.weight                   L.mlp.down_proj.weight             (dense)      copy
decoder.layers.{i}.mlp.router.weight                       L.mlp.gate.weight                  (MoE)        copy
decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight
                                                           L.mlp.experts.{e}.{gate,up}_proj.weight (MoE)   gate_up
decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight
                                                           L.mlp.experts.{e}.down_proj.weight (MoE)        copy
decoder.final_layernorm.weight                             model.norm.weight                               copy
output_layer.weight                                        lm_head.weight                     (untied)     copy
=========================================================  ==============================================  ========

``{e}`` is the global expert index (MoE, ``model.experts``); under expert parallelism a rank's model holds
``local_experts.0 ..`` for its own experts, and ``gyre_hpc.train.moe`` renames them (``to_local``,
``gather_experts``).

Layouts::

    qkv      megatron rows, per query group g (kv groups, q_per_group = heads / kv):
             [ q heads of g (q_per_group * head_dim rows) ; k head g (head_dim) ; v head g (head_dim) ]  g = 0..kv-1
    gate_up  megatron rows [ gate_proj ; up_proj ]

Under tensor parallelism a rank holds a contiguous slice of the megatron layout along the parameter's
``partition_dim``: for ``linear_qkv`` whole query groups (kv divisible by TP), for ``linear_fc1`` its slice of gate
followed by its slice of up (the order ``gyre_hpc.train.checkpoint.gather_full`` undoes).

Invariants
- ``to_hf(to_megatron(hf, cfg), cfg) == hf`` bit for bit, and the other way round (pure re-indexing, no arithmetic).
- ``load_hf_weights`` fills every tensor of the model's state dict exactly once; a tensor missing from the
  checkpoint, an unexpected one or a shape mismatch is a ``CheckpointError`` naming it, before anything is copied.
"""
from __future__ import annotations

from typing import Mapping

import torch

from gyre_hpc.config import ModelConfig
from gyre_hpc.errors import CheckpointError

L = "model.layers.{i}."
M = "decoder.layers.{i}."
#: (megatron name, HF names, layout, present when): the whole mapping; ``{i}`` is the layer index.
TABLE: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "copy", "always"),
    (M + "input_layernorm.weight", (L + "input_layernorm.weight",), "copy", "always"),
    (M + "self_attention.linear_qkv.weight",
     tuple(L + f"self_attn.{p}_proj.weight" for p in "qkv"), "qkv", "always"),
    (M + "self_attention.linear_qkv.bias", tuple(L + f"self_attn.{p}_proj.bias" for p in "qkv"), "qkv", "qkv_bias"),
    (M + "self_attention.q_layernorm.weight", (L + "self_attn.q_norm.weight",), "copy", "qk_layernorm"),
    (M + "self_attention.k_layernorm.weight", (L + "self_attn.k_norm.weight",), "copy", "qk_layernorm"),
    (M + "self_attention.linear_proj.weight", (L + "self_attn.o_proj.weight",), "copy", "always"),
    (M + "pre_mlp_layernorm.weight", (L + "post_attention_layernorm.weight",), "copy", "always"),
    (M + "mlp.linear_fc1.weight", (L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"), "gate_up", "dense"),
    (M + "mlp.linear_fc2.weight", (L + "mlp.down_proj.weight",), "copy", "dense"),
    (M + "mlp.router.weight", (L + "mlp.gate.weight",), "copy", "moe"),
    (M + "mlp.experts.local_experts.{e}.linear_fc1.weight",
     (L + "mlp.experts.{e}.gate_proj.weight", L + "mlp.experts.{e}.up_proj.weight"), "gate_up", "moe"),
    (M + "mlp.experts.local_experts.{e}.linear_fc2.weight", (L + "mlp.experts.{e}.down_proj.weight",), "copy", "moe"),
    ("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", "always"),
    ("output_layer.weight", ("lm_head.weight",), "copy", "untied"),
)


def has_hf_form(cfg: ModelConfig) -> bool:
    """True when the model maps to Hugging Face Qwen2/Qwen3 tensors (RoPE, RMSNorm, SwiGLU)."""
    return cfg.swiglu and cfg.normalization == "RMSNorm" and cfg.position_embedding == "mrope"


def entries(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...], str]]:
    """The table's rows for ``cfg``, layer templates expanded: (megatron name, HF names, layout)."""
    present = {"always": True, "qkv_bias": cfg.qkv_bias, "qk_layernorm": cfg.qk_layernorm,
               "untied": not cfg.tie_embeddings, "dense": cfg.experts == 0, "moe": cfg.experts > 0}
    rows = []
    for mname, hnames, layout, when in TABLE:
        if not present[when]:
            continue
        layers = range(cfg.layers) if "{i}" in mname else (None,)
        experts = range(cfg.experts) if "{e}" in mname else (None,)
        for i in layers:
            for e in experts:
                rows.append((mname.format(i=i, e=e), tuple(h.format(i=i, e=e) for h in hnames), layout))
    return rows


def _groups(cfg: ModelConfig) -> tuple[int, int, int]:
    """(query groups, query heads per group, head dim)."""
    kv = cfg.kv_heads or cfg.heads
    return kv, cfg.heads // kv, cfg.head_dim or cfg.hidden // cfg.heads


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """HF q, k, v (weights ``[out, hidden]`` or biases ``[out]``) → megatron's per-group ``linear_qkv`` rows."""
    kv, per, d = _groups(cfg)
    rest = q.shape[1:]
    parts = (q.reshape(kv, per * d, *rest), k.reshape(kv, d, *rest), v.reshape(kv, d, *rest))
    return torch.cat(parts, dim=1).reshape(kv * (per + 2) * d, *rest)


def split_qkv(qkv: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of ``interleave_qkv``."""
    kv, per, d = _groups(cfg)
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(kv, (per + 2) * d, *rest).split([per * d, d, d], dim=1)
    return q.reshape(kv * per * d, *rest), k.reshape(kv * d, *rest), v.reshape(kv * d, *rest)


def _take(hf: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in hf:
        raise CheckpointError(f"the Hugging Face checkpoint lacks {name}")
    return hf[name]


def to_megatron(hf: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full (un-sharded) megatron tensors from HF tensors; HF tensors the table does not use are an error."""
    out, used = {}, set()
    for mname, hnames, layout in entries(cfg):
        src = [_take(hf, h) for h in hnames]
        used.update(hnames)
        if layout == "qkv":
            out[mname] = interleave_qkv(*src, cfg)
        elif layout == "gate_up":
            out[mname] = torch.cat(src, dim=0)
        else:
            out[mname] = src[0]
    extra = sorted(set(hf) - used - ({"lm_head.weight"} if cfg.tie_embeddings else set()))
    if extra:
        raise CheckpointError(f"the Hugging Face checkpoint has tensors the mapping does not use: {extra[:5]}")
    return out


def to_hf(full: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF tensors from full megatron tensors (``gather_full`` output; ``_extra_state`` entries are ignored)."""
    out = {}
    for mname, hnames, layout in entries(cfg):
        if mname not in full:
            raise CheckpointError(f"the megatron weights lack {mname}")
        t = full[mname]
        if layout == "qkv":
            parts = split_qkv(t, cfg)
        elif layout == "gate_up":
            parts = t.chunk(2, dim=0)
        else:
            parts = (t,)
        out.update({h: p.contiguous() for h, p in zip(hnames, parts)})
    return out


def shard(name: str, full: torch.Tensor, param: torch.Tensor | None, tp: int, rank: int, swiglu: bool) -> torch.Tensor:
    """This TP rank's slice of the full megatron tensor ``full`` for parameter ``param``."""
    if tp == 1 or param is None or not getattr(param, "tensor_model_parallel", False):
        return full
    dim = param.partition_dim
    if swiglu and name.endswith("mlp.linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)
    if full.shape[dim] % tp:
        raise CheckpointError(f"{name}: dimension {dim} of size {full.shape[dim]} does not split over TP={tp}")
    return full.chunk(tp, dim=dim)[rank]


def load_full(model: torch.nn.Module, full: Mapping[str, torch.Tensor], swiglu: bool) -> None:
    """Copy full megatron tensors into ``model`` (this rank's slices); all names and shapes are checked first."""
    from megatron.core import parallel_state as ps

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    params = dict(model.named_parameters())
    own = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    missing, unexpected = sorted(set(own) - set(full)), sorted(set(full) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    slices = {k: shard(k, full[k], params.get(k), tp, rank, swiglu) for k in own}
    for k, t in own.items():
        if tuple(slices[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{k}: checkpoint slice {list(slices[k].shape)}, model {list(t.shape)}")
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(slices[k])


def load_hf_weights(model: torch.nn.Module, cfg: ModelConfig) -> None:
    """Load ``cfg.hf_path``'s safetensors into ``model`` (built from ``cfg``), sliced for this TP rank."""
    from gyre_hpc.train.hf_io import read_safetensors

    from gyre_hpc.train.moe import to_local

    load_full(model, to_local(to_megatron(read_safetensors(cfg.hf_path), cfg), cfg.experts), cfg.swiglu)
