"""Compute layout of a training step: which rows go through one forward, and how long they are.

The local (CPU) attention computes a dense ``[L, L]`` score matrix per row, masked afterwards, so a row costs
``O(L^2)`` however few of its pairs the tree mask allows. Trees of one packed row never attend to each other,
so the trainer may cut a row into its trees and regroup rows of similar length without changing any logit::

    packed row   [ tree A (5) | tree B (3) | pad ]          per-tree rows   [ A A A A A ]
                                                                            [ B B B pad pad ]

``split_trees`` makes every tree (every valid position with ``parent == -1`` and its span) its own row;
``micro_batches`` sorts rows by length and groups them so that rows x longest row <= ``max_tokens``, trimming
the padding columns of each group.

Invariants
- Every valid token appears exactly once across the result, with its tree's parents, spans and depths
  re-indexed to the new row; the tokens each token attends to are unchanged, so logits and the loss are too.
- Padding follows the valid tokens of each row and carries parent -1, span_end == its position, loss_mask 0.
- A group holds at least one row, even one longer than ``max_tokens``.
- ``cut_overlong`` keeps exactly the valid tokens with position id < ``max_seq_len`` (``cut``) or the trees
  without a deeper token (``drop``), each with its ancestors, re-indexed; it never changes what a kept token
  attends to, so their logits are unchanged; the counts are what it left out.
- ``layout`` gives the same parts as ``split_trees`` then ``micro_batches``, each with ``origin``: the flat index
  (``r * L + i``) in the input batch of every position (-1 on padding), so a per-token value computed on a part
  maps back to the input batch (the trainer keeps its first-forward logprobs this way).
"""
from __future__ import annotations

import numpy as np

from gyre_hpc.trajectory.batch import FIELDS, PackedBatch

_PAD = dict(parent=-1, version=-1)


def _from_segments(batch: PackedBatch, segments: list[tuple[int, int, int]]) -> PackedBatch:
    """Rows made of ``(row, start, end)`` slices of ``batch``; index fields are shifted by ``start``."""
    L = max((e - s for _, s, e in segments), default=0)
    out = {}
    for name in FIELDS:
        src = getattr(batch, name)
        arr = np.full((len(segments), L), _PAD.get(name, 0), dtype=src.dtype)
        if name == "span_end":
            arr[:] = np.arange(L)
        for k, (r, s, e) in enumerate(segments):
            v = src[r, s:e]
            if name == "parent":
                v = np.where(v >= 0, v - s, -1)
            elif name == "span_end":
                v = v - s
            arr[k, : e - s] = v
        out[name] = arr
    return PackedBatch(**out, lengths=np.array([e - s for _, s, e in segments], dtype=np.int64))


def _take(src: np.ndarray, segments: list[tuple[int, int, int]], pad: int) -> np.ndarray:
    """The ``(row, start, end)`` slices of ``src`` as rows, right-padded with ``pad``."""
    L = max((e - s for _, s, e in segments), default=0)
    out = np.full((len(segments), L), pad, dtype=src.dtype)
    for k, (r, s, e) in enumerate(segments):
        out[k, : e - s] = src[r, s:e]
    return out


def _tree_segments(batch: PackedBatch) -> list[tuple[int, int, int]]:
    segments = []
    for r, n in enumerate(batch.lengths):
        roots = np.nonzero(batch.parent[r, :n] < 0)[0]
        segments += [(r, int(i), int(batch.span_end[r, i]) + 1) for i in roots]
    return segments


def _length_groups(batch: PackedBatch, max_tokens: int | None) -> list[list[tuple[int, int, int]]]:
    order = [int(r) for r in np.argsort(-batch.lengths, kind="stable")]
    groups: list[list[int]] = []
    for r in order:
        if groups and (max_tokens is None or (len(groups[-1]) + 1) * int(batch.lengths[groups[-1][0]]) <= max_tokens):
            groups[-1].append(r)
        else:
            groups.append([r])
    return [[(r, 0, int(batch.lengths[r])) for r in g] for g in groups]


def split_trees(batch: PackedBatch) -> PackedBatch:
    """One row per tree (pre-order root and its span), in row order then position order."""
    return _from_segments(batch, _tree_segments(batch))


def micro_batches(batch: PackedBatch, max_tokens: int | None) -> list[PackedBatch]:
    """Rows grouped by length (longest first), each group at most ``max_tokens`` padded tokens; None = one group."""
    return [_from_segments(batch, g) for g in _length_groups(batch, max_tokens)]


def _origin(batch: PackedBatch) -> np.ndarray:
    R, L = batch.shape
    origin = np.arange(R * L, dtype=np.int64).reshape(R, L)
    return np.where(np.arange(L)[None, :] < batch.lengths[:, None], origin, -1)


def cut_overlong(batch: PackedBatch, max_seq_len: int, rule: str = "cut"
                 ) -> tuple[PackedBatch, np.ndarray | None, dict[str, float]]:
    """Leave out every token whose position id is ``>= max_seq_len`` (``train.overlong``): ``cut`` drops the
    token and its subtree (a path's tail), ``drop`` the whole tree holding it. Returns ``(batch', origin, counts)``:
    ``origin`` maps ``batch'`` positions to flat indices of ``batch`` (None when nothing was cut: ``batch`` itself
    is returned), ``counts`` ``overlong_tokens_cut`` and ``overlong_trained_tokens_cut``. Kept tokens keep their
    ancestors (depth grows along a path; a tree goes whole), so the kept rows are valid trees again."""
    R, L = batch.shape
    valid = np.arange(L)[None, :] < batch.lengths[:, None]
    keep = valid & (batch.position_ids < max_seq_len)
    if rule == "drop":
        for r, s, e in _tree_segments(batch):
            if not keep[r, s:e].all():
                keep[r, s:e] = False
    elif rule != "cut":
        raise ValueError(f"unknown overlong rule {rule!r}; expected 'cut' or 'drop'")
    gone = valid & ~keep
    counts = {"overlong_tokens_cut": float(gone.sum()),
              "overlong_trained_tokens_cut": float(batch.loss_mask[gone].sum())}
    if not gone.any():
        return batch, None, counts
    cnt = np.cumsum(keep, axis=1)
    n = keep.sum(1)
    L2 = int(n.max(initial=0))
    origin = np.full((R, L2), -1, np.int64)
    out = {}
    for name in FIELDS:
        src = getattr(batch, name)
        arr = np.full((R, L2), _PAD.get(name, 0), dtype=src.dtype)
        if name == "span_end":
            arr[:] = np.arange(L2)
        for r in range(R):
            sel = np.flatnonzero(keep[r])
            v = src[r, sel]
            if name == "parent":
                v = np.where(v >= 0, cnt[r, np.maximum(v, 0)] - 1, -1)
            elif name == "span_end":
                v = cnt[r, v] - 1
            arr[r, : len(sel)] = v
            origin[r, : len(sel)] = r * L + sel
        out[name] = arr
    return PackedBatch(**out, lengths=n.astype(np.int64)), origin, counts


def layout(batch: PackedBatch, split: bool, max_tokens: int | None, origin: np.ndarray | None = None
           ) -> list[tuple[PackedBatch, np.ndarray]]:
    """``(part, origin)`` per forward: ``split_trees`` (when ``split``) then ``micro_batches``; ``origin[k, i]`` is
    the flat index into ``batch``'s ``[R, L]`` arrays of the part's position ``(k, i)``, -1 on padding. A given
    ``origin`` (``cut_overlong``'s) maps ``batch`` onward to an earlier batch instead."""
    origin = _origin(batch) if origin is None else origin
    if split:
        segments = _tree_segments(batch)
        origin, batch = _take(origin, segments, -1), _from_segments(batch, segments)
    return [(_from_segments(batch, g), _take(origin, g, -1)) for g in _length_groups(batch, max_tokens)]
