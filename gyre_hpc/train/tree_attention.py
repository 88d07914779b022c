"""Tree attention with memory linear in tokens: the mask comes from the O(T) ``span_end`` vector, tile by tile.

A packed row holds pre-order (DFS) serialized trees. Key ``k`` is visible to query ``q`` exactly when
``k <= q <= span_end[k]`` (``span_end[k]``: the last position of ``k``'s subtree; ``PackedBatch``). A flat path is
the special case ``span_end[k] = n - 1`` (causal), padding the case ``span_end[k] = k`` (attends itself).

``tree_attention(q, k, v, span_end, scale)`` computes ``softmax(q kᵀ · scale + mask) v`` per head without any
``[T, T]`` tensor:

- **CPU (and any device)**: a blockwise, online-softmax (flash-style) kernel in plain torch. Queries and keys are
  cut into ``block``-sized tiles; a tile's mask is built from the tile's slice of ``span_end``; a tile no row can
  see (``k0 > q1 - 1`` or ``max(span_end[k-tile]) < q0``) is skipped. Forward keeps only the output and the
  per-query log-sum-exp (O(T)); the custom backward recomputes each tile's probabilities (flash-attention 2
  style), so activations stay O(T · head_dim) and the largest temporary is one ``[b, heads, block, block]`` tile.
- **CUDA**: torch's FlexAttention with a block mask built from the same vector (``mask_mod``:
  ``k <= q <= span_end[k]``), compiled once; it skips fully-masked blocks in its own kernel. Select with
  ``backend="flex"`` (``"auto"`` picks it on CUDA when FlexAttention imports, else the blockwise kernel).

Grouped-query attention: ``q`` has ``hq`` heads, ``k``/``v`` ``hk`` heads with ``hq % hk == 0``; query head
``h`` reads key/value head ``h // (hq // hk)`` (megatron's ``repeat_interleave`` convention). Tensor parallel
needs nothing more: each rank runs the kernel on its local heads.

Invariants (tests/unit/test_tree_attention.py, tests/integration/test_train_exactness.py)
- Equal to dense masked softmax attention (``dense_reference``) in value and in the gradients of q, k, v, up to
  float rounding (float32: within 1e-5 relative), for any block size, tree shape, padding and GQA ratio.
- No tensor with two sequence dimensions larger than ``block`` is created, forward or backward.
- Every query sees at least itself, so no softmax row is empty.
"""
from __future__ import annotations

import math

import torch

#: default tile edge (queries x keys) of the blockwise kernel; 512 keeps a [1, 4, 512, 512] fp32 tile at 4 MiB
BLOCK = 512


def dense_reference(q, k, v, span_end, scale):
    """The [T, T] reference: masked softmax attention (tests only). Shapes as ``tree_attention``."""
    T = q.shape[2]
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    ar = torch.arange(T, device=q.device)
    allowed = (ar[None, :] <= ar[:, None]) & (ar[:, None] <= span_end[:, None, :])  # [b, q, k]
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v.float()).to(q.dtype)


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    hk = x.shape[1]
    return x if hk == hq else x.repeat_interleave(hq // hk, dim=1)


def _tiles(span_end: torch.Tensor, T: int, block: int):
    """``(qi, q0, q1, [(k0, k1, full)])`` per query tile: the key tiles any row can see; ``full``: no masking."""
    starts = list(range(0, T, block))
    kmax = [int(span_end[:, s:min(s + block, T)].max()) for s in starts]
    kmin = [int(span_end[:, s:min(s + block, T)].min()) for s in starts]
    out = []
    for q0 in starts:
        q1 = min(q0 + block, T)
        keys = []
        for j, k0 in enumerate(starts):
            k1 = min(k0 + block, T)
            if k0 > q1 - 1:
                break
            if kmax[j] < q0:
                continue
            keys.append((k0, k1, k1 - 1 <= q0 and kmin[j] >= q1 - 1))
        out.append((q0, q1, keys))
    return out


def _tile_mask(span_end: torch.Tensor, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """Bool ``[b, 1, q1-q0, k1-k0]``: True where query may see key."""
    dev = span_end.device
    qq = torch.arange(q0, q1, device=dev)[:, None]
    kk = torch.arange(k0, k1, device=dev)[None, :]
    return ((kk <= qq) & (qq <= span_end[:, None, k0:k1]))[:, None]


class _BlockwiseTreeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, span_end, scale, block):
        b, h, T, d = q.shape
        acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        out = torch.empty(b, h, T, v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(b, h, T, dtype=acc, device=q.device)
        tiles = _tiles(span_end, T, block)
        for q0, q1, keys in tiles:
            qi = q[:, :, q0:q1].to(acc) * scale
            m = torch.full((b, h, q1 - q0, 1), float("-inf"), dtype=acc, device=q.device)
            l = torch.zeros_like(m)
            o = torch.zeros(b, h, q1 - q0, v.shape[-1], dtype=acc, device=q.device)
            for k0, k1, full in keys:
                s = qi @ k[:, :, k0:k1].to(acc).transpose(-1, -2)
                if not full:
                    s = s.masked_fill(~_tile_mask(span_end, q0, q1, k0, k1), float("-inf"))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                # a row may see nothing in this tile or before it: keep its -inf max finite for exp()
                m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - m_safe)
                alpha = torch.exp(m - m_safe)
                l = l * alpha + p.sum(-1, keepdim=True)
                o = o * alpha + p @ v[:, :, k0:k1].to(acc)
                m = m_new
            out[:, :, q0:q1] = (o / l).to(q.dtype)
            lse[:, :, q0:q1] = (m + torch.log(l)).squeeze(-1)
        ctx.save_for_backward(q, k, v, span_end, out, lse)
        ctx.scale, ctx.tiles = scale, tiles
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, span_end, out, lse = ctx.saved_tensors
        scale = ctx.scale
        acc = lse.dtype
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        dout = dout.to(acc)
        delta = (dout * out.to(acc)).sum(-1, keepdim=True)  # [b, h, T, 1]
        for q0, q1, keys in ctx.tiles:
            qi = q[:, :, q0:q1].to(acc)
            doi = dout[:, :, q0:q1]
            li = lse[:, :, q0:q1, None]
            di = delta[:, :, q0:q1]
            dqi = dq[:, :, q0:q1]
            for k0, k1, full in keys:
                kj, vj = k[:, :, k0:k1].to(acc), v[:, :, k0:k1].to(acc)
                p = torch.exp((qi @ kj.transpose(-1, -2)) * scale - li)
                if not full:
                    p = p.masked_fill(~_tile_mask(span_end, q0, q1, k0, k1), 0.0)
                dv[:, :, k0:k1] += p.transpose(-1, -2) @ doi
                ds = p * (doi @ vj.transpose(-1, -2) - di)
                dqi += (ds @ kj) * scale
                dk[:, :, k0:k1] += (ds.transpose(-1, -2) @ qi) * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


_FLEX = {}
FLEX_BLOCK = 128


def flex_block_mask(span_end: torch.Tensor, T: int, block: int = FLEX_BLOCK):
    """FlexAttention's ``BlockMask`` for ``span_end`` [b, T] (``T`` a multiple of ``block``), from per-block
    minima and maxima of ``span_end`` (the same rule as ``_tiles``, as [T/block, T/block] tensors), never from a
    dense [T, T] mask (``create_block_mask`` builds one in eager mode). The last mask is reused while the same
    ``span_end`` tensor comes back (every layer of one forward)."""
    from torch.nn.attention.flex_attention import BlockMask

    last = _FLEX.get("mask")
    if last is not None and last[0] is span_end and last[1] == (T, block):
        return last[2]
    b, n, dev = span_end.shape[0], T // block, span_end.device
    blocks = span_end.view(b, n, block)
    kmax, kmin = blocks.amax(dim=(0, 2)), blocks.amin(dim=(0, 2))  # [n] over rows: conservative, exact by mask_mod
    start = torch.arange(n, device=dev) * block
    q0, q1 = start[:, None], start[:, None] + block  # query tile i (rows), key tile j (columns)
    k0, k1 = start[None, :], start[None, :] + block
    seen = (k0 <= q1 - 1) & (kmax[None, :] >= q0)
    full = seen & (k1 - 1 <= q0) & (kmin[None, :] >= q1 - 1)
    part = seen & ~full

    def lists(m):
        num = m.sum(-1).to(torch.int32)
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # visible tiles first
        return num[None, None].expand(b, 1, n).contiguous(), idx[None, None].expand(b, 1, n, n).contiguous()

    def mask_mod(bi, hi, qi, ki):
        return (ki <= qi) & (qi <= span_end[bi, ki])

    (pn, pi), (fn, fi) = lists(part), lists(full)
    mask = BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=block, mask_mod=mask_mod)
    _FLEX["mask"] = (span_end, (T, block), mask)
    return mask


def _flex(q, k, v, span_end, scale, compiled: bool = True):
    """FlexAttention with a block mask from ``span_end`` (CUDA: compiled once per process). ``T`` is padded to a
    multiple of ``FLEX_BLOCK`` (padding attends only itself) so that few shapes compile."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if compiled:
        if "fn" not in _FLEX:
            _FLEX["fn"] = torch.compile(flex_attention, dynamic=True)
        fn = _FLEX["fn"]
    b, hq, T, _ = q.shape
    pad = -T % FLEX_BLOCK
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        last = _FLEX.get("padded")
        if last is not None and last[0] is span_end:
            span_end = last[1]
        else:
            tail = torch.arange(T, T + pad, device=span_end.device).expand(b, pad)
            padded = torch.cat([span_end, tail], 1)
            _FLEX["padded"] = (span_end, padded)
            span_end = padded
    mask = flex_block_mask(span_end, T + pad)
    out = fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=hq != k.shape[1])
    return out[:, :, :T]


def flex_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def tree_attention(q, k, v, span_end, scale: float | None = None, block: int | None = None, backend: str = "auto"):
    """Tree-masked attention. ``q`` [b, hq, T, d], ``k``/``v`` [b, hk, T, d], ``span_end`` int [b, T];
    returns [b, hq, T, d]. ``block``: tile edge, None = ``BLOCK``; ``backend``: auto | blockwise | flex (see the
    module docstring)."""
    block = block or BLOCK
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    span_end = span_end.to(device=q.device, dtype=torch.int64)
    if backend == "flex" or (backend == "auto" and flex_available(q.device)):
        return _flex(q, k, v, span_end, scale)
    hq = q.shape[1]
    return _BlockwiseTreeAttention.apply(q, _expand_kv(k, hq), _expand_kv(v, hq), span_end, scale, block)
