"""A forward of the trainer's megatron ``GPTModel`` (local layer spec, TP=1) that reads and writes a paged KV cache.

It reuses the model's own modules, layer by layer: the embedding, ``input_layernorm``, the attention's
``get_query_key_value_tensors`` (interleaved GQA split, optional q/k norm and qkv bias), megatron's rotary
embedding at the given positions (``mrope`` with three equal rows), ``linear_proj``, ``pre_mlp_layernorm``, the
MLP, ``final_layernorm`` and the output layer (tied or not). Only the core attention is its own: each request's
queries attend the keys gathered from its block table, causally by absolute position.

All requests' new tokens run as one flat sequence through the token-wise parts (norms, projections, MLP); the
attention loops over requests. The TransformerConfig is read from the model, never assumed.

Invariants
- ``KVStore`` holds ``[layers, blocks, block_size, kv_groups, head_dim]`` keys and values in the model's dtype.
- ``forward`` writes the K/V of every new token at ``table[p // B]``, slot ``p % B`` (p its absolute position),
  before any query reads them, and touches no other slot.
- ``forward``'s logits equal the last-position logits of ``forward_logits`` over the whole sequence (up to float
  rounding) when the cache holds the K/V of positions ``< start`` computed by the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Item:
    """One request's share of a forward: ``ids`` at positions ``start ..``, its K/V going to ``table``."""

    ids: Sequence[int]
    start: int
    table: Sequence[int]


class KVStore:
    def __init__(self, model: torch.nn.Module, num_blocks: int, block_size: int):
        cfg = model.config
        groups = cfg.num_query_groups or cfg.num_attention_heads
        head_dim = cfg.kv_channels or cfg.hidden_size // cfg.num_attention_heads
        p = next(model.parameters())
        shape = (cfg.num_layers, num_blocks, block_size, groups, head_dim)
        self.block_size = block_size
        self.k = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


def _slots(items: Sequence[Item], block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, slots = [], []
    for it in items:
        for p in range(it.start, it.start + len(it.ids)):
            blocks.append(it.table[p // block_size])
            slots.append(p % block_size)
    return torch.tensor(blocks, device=device), torch.tensor(slots, device=device)


def _geometry(items: Sequence[Item], block_size: int, device) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per item: the blocks holding positions ``0 .. start + n - 1`` and the causal mask (None for one query)."""
    out = []
    for it in items:
        n, total = len(it.ids), it.start + len(it.ids)
        table = torch.as_tensor(list(it.table[: -(-total // block_size)]), device=device)
        pos_q = torch.arange(it.start, total, device=device).unsqueeze(1)
        attend = pos_q >= torch.arange(total, device=device).unsqueeze(0)  # [n, total], True = attend
        out.append((table, None if n == 1 else attend))
    return out


def _attend(att, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, items: Sequence[Item],
            geometry) -> torch.Tensor:
    """Core attention per request: ``q`` [T, np, hn] flat over items; returns [T, np * hn]."""
    outs, off = [], 0
    scale = att.core_attention.softmax_scale
    for it, (table, attend) in zip(items, geometry):
        n, total = len(it.ids), it.start + len(it.ids)
        k = kc[table].flatten(0, 1)[:total]  # [total, ng, hn]
        v = vc[table].flatten(0, 1)[:total]
        qi = q[off:off + n]
        o = F.scaled_dot_product_attention(qi.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                           v.transpose(0, 1).unsqueeze(0), attn_mask=attend, scale=scale,
                                           enable_gqa=qi.shape[1] != k.shape[1])
        outs.append(o[0].transpose(0, 1).reshape(n, -1))
        off += n
    return torch.cat(outs, 0)


def _plus_bias(out_bias) -> torch.Tensor:
    out, bias = out_bias
    return out if bias is None else out + bias


@torch.inference_mode()
def forward(model: torch.nn.Module, store: KVStore, items: Sequence[Item]) -> torch.Tensor:
    """Logits ``[len(items), V]`` at each item's last new token; writes the new tokens' K/V into ``store``."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    dev = store.k.device
    ids = torch.tensor([t for it in items for t in it.ids], device=dev).unsqueeze(0)  # [1, T]
    pos = torch.tensor([p for it in items for p in range(it.start, it.start + len(it.ids))], device=dev).unsqueeze(0)
    x = model.embedding(input_ids=ids, position_ids=pos)  # [T, 1, h]
    rot = None
    if model.position_embedding_type == "mrope":
        rot = model.rotary_pos_emb(pos.unsqueeze(0).expand(3, -1, -1), model.mrope_section)
    elif model.position_embedding_type != "learned_absolute":
        raise ValueError(f"cached forward: position embedding {model.position_embedding_type!r} not supported")
    blocks, slots = _slots(items, store.block_size, dev)
    geometry = _geometry(items, store.block_size, dev)
    for li, layer in enumerate(model.decoder.layers):
        att = layer.self_attention
        q, k, v = att.get_query_key_value_tensors(layer.input_layernorm(x))  # [T, 1, heads|groups, hn]
        if rot is not None:
            q = apply_rotary_pos_emb(q, rot, config=att.config)
            k = apply_rotary_pos_emb(k, rot, config=att.config)
        store.k[li, blocks, slots] = k[:, 0]
        store.v[li, blocks, slots] = v[:, 0]
        ctx = _attend(att, q[:, 0], store.k[li], store.v[li], items, geometry)
        x = x + _plus_bias(att.linear_proj(ctx.unsqueeze(1)))
        x = x + _plus_bias(layer.mlp(layer.pre_mlp_layernorm(x)))
    last = torch.tensor(list(_last_indices(items)), device=dev)
    h = model.decoder.final_layernorm(x[last])  # [b, 1, h]
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(h, weight=weight, runtime_gather_output=True)
    return logits[:, 0]


def _last_indices(items: Sequence[Item]):
    off = 0
    for it in items:
        off += len(it.ids)
        yield off - 1
