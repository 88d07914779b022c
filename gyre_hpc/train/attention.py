"""A fused core attention for megatron's local layer spec: ``torch.nn.functional.scaled_dot_product_attention``.

megatron's ``DotProductAttention`` (the local spec's core attention) materialises the ``[b, heads, s, s]``
scores, masks them and runs softmax as separate passes. ``SDPAttention`` keeps its constructor, parameters and
call signature (it is a subclass) and computes the same function with PyTorch's fused kernel, which takes the
same arbitrary boolean mask (inverted: SDPA's True means *attend*). Select it with
``model.attention: sdpa``.

Invariants
- Same inputs, same output as ``DotProductAttention`` up to float rounding, for tree masks, grouped-query
  attention and tensor-parallel head shards (tested through the whole model).
- No mask means causal, as in megatron; dropout is applied only in training mode.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


class SDPAttention(DotProductAttention):
    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """``query`` [sq, b, np, hn], ``key``/``value`` [sk, b, ng, hn], mask bool [b|1, 1, sq, sk] True = masked;
        returns [sq, b, np * hn]."""
        assert packed_seq_params is None and attention_bias is None, "SDPAttention takes neither"
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if attention_mask is None else ~attention_mask,
            is_causal=attention_mask is None,
            dropout_p=self.attention_dropout.p if self.training else 0.0,
            scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


class TreeAttention(DotProductAttention):
    """Core attention for tree rows from the O(T) ``span_end`` vector (``gyre_hpc.train.tree_attention``); select
    with ``model.attention: tree``.

    ``attention_mask`` may be the row's ``span_end`` (int ``[b, s]``: the tree, no ``[s, s]`` tensor anywhere),
    None (causal: ``span_end = s - 1``) or a dense bool mask (then computed as ``SDPAttention`` does, for callers
    that build one, e.g. ``gyre model check``). Works per local head, so under tensor parallel each rank runs its
    own heads' share."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            return SDPAttention.forward(self, query, key, value, attention_mask, attn_mask_type, attention_bias,
                                        packed_seq_params)
        assert packed_seq_params is None and attention_bias is None, "TreeAttention takes neither"
        from gyre_hpc.train.tree_attention import tree_attention

        sq, b = query.shape[0], query.shape[1]
        span_end = attention_mask if attention_mask is not None else torch.full((b, sq), sq - 1, dtype=torch.int64)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        out = tree_attention(q, k, v, span_end, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
