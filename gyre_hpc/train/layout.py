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


def layout(batch: PackedBatch, split: bool, max_tokens: int | None) -> list[tuple[PackedBatch, np.ndarray]]:
    """``(part, origin)`` per forward: ``split_trees`` (when ``split``) then ``micro_batches``; ``origin[k, i]`` is
    the flat index into ``batch``'s ``[R, L]`` arrays of the part's position ``(k, i)``, -1 on padding."""
    R, L = batch.shape
    origin = np.arange(R * L, dtype=np.int64).reshape(R, L)
    origin = np.where(np.arange(L)[None, :] < batch.lengths[:, None], origin, -1)
    if split:
        segments = _tree_segments(batch)
        origin, batch = _take(origin, segments, -1), _from_segments(batch, segments)
    return [(_from_segments(batch, g), _take(origin, g, -1)) for g in _length_groups(batch, max_tokens)]
