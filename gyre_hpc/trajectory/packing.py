"""Packers: selected paths of scored runs → one ``PackedBatch`` (see ``batch.py`` for the row format).

Tree mode serializes each run's selected subtree once, in pre-order, and packs whole run trees into rows
(first-fit decreasing, at most ``max_row_tokens`` per row)::

    run A (2 paths)              run B          row 0:  s q a b x y | s q c d      parent -1 0 1 2 1 4 | -1 0 1 2
      s ─ q ─ a ─ b              s ─ q ─ c ─ d          position      0 1 2 3 2 3 |  0 1 2 3
            └ x ─ y

Flat mode makes one row per selected path, in each run's priority order; a generated token that lies on
several paths gets ``loss_mask`` 1 only in the first row that contains it::

    row 0:  s q a b     loss 0 0 1 1
    row 1:  s q x y     loss 0 0 1 1        (row 1 repeats s q: computed twice in flat mode)

Invariants
- Both modes train the same set of (run, generated node) pairs, each exactly once, with its run's advantage,
  so ``loss_mask.sum()`` and the loss are the same in both modes.
- Input-only nodes have loss_mask 0, advantage 0, old_logprob 0 and version -1.
- A run tree (tree mode) or a path (flat mode) longer than ``max_row_tokens`` raises a ``TrajectoryError`` naming
  the run and the settings that fix it; nothing is truncated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.batch import PackedBatch
from gyre_hpc.trajectory.tree import RunTree, TreeArrays


@dataclass(frozen=True, eq=False)
class RunItem:
    """One trained run: its tree, the kept leaves (priority order) and its advantage."""

    run_id: str
    tree: RunTree
    leaves: tuple[int, ...]
    advantage: float
    call_ids: tuple[str, ...] = ()  # the run's call ids in file order (for messages)


@dataclass(frozen=True, eq=False)
class Segment:
    """A serialized tree with row-local indices (parent -1 at roots)."""

    tokens: np.ndarray
    position: np.ndarray
    parent: np.ndarray
    span_end: np.ndarray
    loss: np.ndarray  # bool
    advantage: float
    logprob: np.ndarray
    version: np.ndarray


def _tree_segment(t: TreeArrays, advantage: float) -> Segment:
    return Segment(t.tokens, t.depth, t.parent, t.span_end, t.generated, advantage, t.logprob, t.version)


_PAD = dict(input_ids=0, position_ids=0, parent=-1, loss_mask=0.0, advantage=0.0, old_logprob=0.0, version=-1)
_DTYPE = dict(input_ids=np.int64, position_ids=np.int64, parent=np.int64, span_end=np.int64,
              loss_mask=np.float32, advantage=np.float32, old_logprob=np.float32, version=np.int64)


def _fill(b: dict[str, np.ndarray], r: int, sl: slice, s: Segment) -> None:
    b["input_ids"][r, sl] = s.tokens
    b["position_ids"][r, sl] = s.position
    parent, span_end = b["parent"][r, sl], b["span_end"][r, sl]
    parent[:] = s.parent
    span_end[:] = s.span_end
    if sl.start:  # shift row-local indices; roots stay -1
        roots = np.flatnonzero(s.parent < 0)
        parent += sl.start
        parent[roots] = -1
        span_end += sl.start
    loss = b["loss_mask"][r, sl]
    loss[:] = s.loss
    np.multiply(loss, np.float32(s.advantage), out=b["advantage"][r, sl])
    b["old_logprob"][r, sl] = s.logprob
    b["version"][r, sl] = s.version


def _assemble(rows: list[list[Segment]]) -> PackedBatch:
    """Rows of segments → padded [R, L] arrays (padding: see ``_PAD``; span_end of padding = its position)."""
    lengths = np.array([sum(len(s.tokens) for s in row) for row in rows], np.int64)
    R, L = len(rows), int(lengths.max()) if rows else 0
    b = {k: np.empty((R, L), dt) for k, dt in _DTYPE.items()}
    for r, row in enumerate(rows):
        base = 0
        for s in row:
            _fill(b, r, slice(base, base + len(s.tokens)), s)
            base += len(s.tokens)
        for k, v in _PAD.items():
            b[k][r, base:] = v
        b["span_end"][r, base:] = np.arange(base, L)
    return PackedBatch(lengths=lengths, **b)


def _first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = next((r for r, f in enumerate(free) if f >= sizes[i]), None)
        if r is None:
            rows.append([])
            free.append(capacity)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= sizes[i]
    return rows


def pack_tree(items: Sequence[RunItem], max_row_tokens: int) -> PackedBatch:
    """Each run's selected subtree serialized once; whole trees packed into rows."""
    segments = [_tree_segment(it.tree.restrict(it.leaves), it.advantage) for it in items if it.leaves]
    named = [it for it in items if it.leaves]
    for it, s in zip(named, segments):
        if len(s.tokens) > max_row_tokens:
            raise TrajectoryError(
                f"run {it.run_id}: its tree of {len(it.leaves)} path(s) has {len(s.tokens)} tokens, more than "
                f"trajectory.max_row_tokens={max_row_tokens}; raise trajectory.max_row_tokens, lower "
                f"trajectory.j_max, or use flat mode")
    rows = _first_fit_decreasing([len(s.tokens) for s in segments], max_row_tokens)
    return _assemble([[segments[i] for i in row] for row in rows])


def flat_segments(item: RunItem) -> list[Segment]:
    """One chain per kept path; a generated node is trained in the first path (priority order) holding it."""
    t = item.tree.nodes
    seen = np.zeros(len(t), bool)
    out = []
    for leaf in item.leaves:
        nodes = item.tree.path_nodes(leaf)
        n = len(nodes)
        loss = t.generated[nodes] & ~seen[nodes]
        seen[nodes] = True
        out.append(Segment(t.tokens[nodes], np.arange(n, dtype=np.int64), np.arange(-1, n - 1, dtype=np.int64),
                           np.full(n, n - 1, np.int64), loss, item.advantage, t.logprob[nodes], t.version[nodes]))
    return out


def pack_flat(items: Sequence[RunItem], max_row_tokens: int) -> PackedBatch:
    """One row per kept path."""
    rows = []
    for it in items:
        for leaf, s in zip(it.leaves, flat_segments(it)):
            if len(s.tokens) > max_row_tokens:
                call = int(it.tree.leaf_call[leaf])
                name = it.call_ids[call] if it.call_ids else f"#{call}"
                raise TrajectoryError(
                    f"run {it.run_id}: the path ending at call {name} has {len(s.tokens)} tokens, more than "
                    f"trajectory.max_row_tokens={max_row_tokens}; raise trajectory.max_row_tokens")
            rows.append([s])
    return _assemble(rows)
