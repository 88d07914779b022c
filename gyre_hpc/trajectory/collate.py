"""Collation: a ``PackedBatch`` (numpy) becomes the torch tensors the training step consumes.

The dense attention mask is megatron's convention, bool ``[R, 1, L, L]`` with True = masked::

    masked[r, 0, i, j] = not (j <= i <= span_end[r, j])     (i attends its tree ancestors and itself)

Invariants
- The mask equals ``~PackedBatch.attention_allowed(r)`` for every row; every position attends at least itself,
  so no softmax row is empty (padding included).
- Integer fields become int64, weights float32; values are copied, never shared with the numpy arrays.
"""
from __future__ import annotations

import numpy as np
import torch

from gyre_hpc.trajectory.batch import PackedBatch

INT_FIELDS = ("input_ids", "position_ids", "parent", "span_end", "version", "lengths")
FLOAT_FIELDS = ("loss_mask", "advantage", "old_logprob")


def attention_mask(span_end: torch.Tensor) -> torch.Tensor:
    """Bool ``[R, 1, L, L]``, True where position ``i`` (dim 2) may NOT attend ``j`` (dim 3)."""
    L = span_end.shape[1]
    ar = torch.arange(L, device=span_end.device)
    i = ar.view(1, L, 1)
    j = ar.view(1, 1, L)
    allowed = (j <= i) & (i <= span_end.unsqueeze(1))
    return (~allowed).unsqueeze(1)


def to_tensors(batch: PackedBatch, device: str | torch.device = "cpu", dense_mask: bool = True
               ) -> dict[str, torch.Tensor]:
    """All fields of ``batch`` as tensors on ``device`` plus ``attention_mask`` (see the module docstring);
    ``dense_mask`` False leaves the [R, 1, L, L] mask out (tree attention reads ``span_end`` alone)."""
    out = {k: torch.from_numpy(np.array(getattr(batch, k), dtype=np.int64)).to(device) for k in INT_FIELDS}
    out.update({k: torch.from_numpy(np.array(getattr(batch, k), dtype=np.float32)).to(device) for k in FLOAT_FIELDS})
    if dense_mask:
        out["attention_mask"] = attention_mask(out["span_end"])
    return out
