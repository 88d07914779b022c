"""``PackedBatch``: the one format both packers (flat and tree) produce and the trainer consumes.

Rows hold one or more pre-order serialized token trees (a path in flat mode is a tree without branches)::

    run tree               row (pre-order)         parent       span_end     position_ids
      s ─ a ─ b            pos: 0 1 2 3 4           -1 0 1 1 3   4 4 2 4 4    0 1 2 2 3
            └ c ─ d        tok: s a b c d

Per row ``r`` and position ``i``:

- ``input_ids[r, i]``    the token (0 on padding).
- ``position_ids[r, i]`` its depth in its tree: the position the model sees, so a branch continues where its
  prefix ended.
- ``parent[r, i]``       the row position of its tree parent, -1 for a root or padding. Token ``i`` is
  *predicted from the model output at* ``parent[r, i]`` (a position with two children predicts both).
- ``span_end[r, i]``     the last row position of ``i``'s subtree. Attention: ``i`` may attend ``j`` iff
  ``j <= i <= span_end[r, j]`` (ancestors and itself). Padding has ``span_end[r, i] == i`` (attends itself).
- ``loss_mask[r, i]``    1.0 where token ``i`` is trained, else 0.0.
- ``advantage[r, i]``    the advantage of the run the token belongs to (0.0 where not trained).
- ``old_logprob[r, i]``  the logprob of the generating policy (0.0 where not generated).
- ``version[r, i]``      the policy version that generated the token (-1 where not generated).

Invariants (checked by ``validate``): parents precede their children; a child's depth is its parent's plus one;
a subtree span contains the spans of its children; trained tokens have a parent. Across a whole batch, every
generated token of every selected path carries ``loss_mask`` exactly once, so the normalizer
``loss_mask.sum()`` is the same in both modes and flat and tree give the same loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre_hpc.errors import TrajectoryError

FIELDS = ("input_ids", "position_ids", "parent", "span_end", "loss_mask", "advantage", "old_logprob", "version")


@dataclass(frozen=True)
class PackedBatch:
    input_ids: np.ndarray  # int64 [R, L]
    position_ids: np.ndarray  # int64 [R, L]
    parent: np.ndarray  # int64 [R, L]
    span_end: np.ndarray  # int64 [R, L]
    loss_mask: np.ndarray  # float32 [R, L]
    advantage: np.ndarray  # float32 [R, L]
    old_logprob: np.ndarray  # float32 [R, L]
    version: np.ndarray  # int64 [R, L]
    lengths: np.ndarray  # int64 [R], valid tokens per row (the rest is padding)

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape

    @property
    def tokens(self) -> int:
        """Tokens the model computes (valid positions, padding excluded)."""
        return int(self.lengths.sum())

    @property
    def trained_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def attention_allowed(self, row: int) -> np.ndarray:
        """Dense bool [L, L] of row ``row``: ``allowed[i, j]`` iff ``i`` may attend ``j``."""
        L = self.input_ids.shape[1]
        i = np.arange(L)[:, None]
        j = np.arange(L)[None, :]
        return (j <= i) & (i <= self.span_end[row][None, :])

    def validate(self) -> "PackedBatch":
        R, L = self.input_ids.shape
        for name in FIELDS:
            if getattr(self, name).shape != (R, L):
                raise TrajectoryError(f"PackedBatch.{name} has shape {getattr(self, name).shape}, expected {(R, L)}")
        pos = np.broadcast_to(np.arange(L), (R, L))
        has_parent = self.parent >= 0
        if np.any(self.parent[has_parent] >= pos[has_parent]):
            raise TrajectoryError("PackedBatch: a parent does not precede its child")
        rows, cols = np.nonzero(has_parent)
        par = self.parent[rows, cols]
        if np.any(self.position_ids[rows, cols] != self.position_ids[rows, par] + 1):
            raise TrajectoryError("PackedBatch: a child's depth is not its parent's depth + 1")
        if np.any(self.span_end[rows, par] < self.span_end[rows, cols]):
            raise TrajectoryError("PackedBatch: a child's subtree span leaves its parent's span")
        if np.any((self.loss_mask > 0) & ~has_parent):
            raise TrajectoryError("PackedBatch: a trained token has no parent to be predicted from")
        return self
