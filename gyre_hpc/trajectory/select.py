"""J_max: which paths (leaves) of a run's prefix tree enter training.

::

    run tree (leaf = last call on the path)      final_then_recent, J_max = 2
      s ─ q ─ a ─ b ─ c      leaf L0, calls 0,1     keep L2 (the final call's path: it produced the answer),
            └ x ─ y          leaf L1, call 2        then L1 (the most recent other: last call 2 > 1),
              └ z ─ w        leaf L2, call 3 (final) drop L0

Rules (``trajectory.selection``):

- ``final_then_recent`` (default): the path of the run's final call, then the others by their most recent call.
- ``final_then_longest``: the final path, then the others by generated tokens on the path (ties: most recent).
- ``longest``: all paths by generated tokens on the path (ties: most recent).

"Recent" and "latest" are ``RunTree.leaf_recency`` (tree.py): record order of the most recent call on the path,
ties (a call re-sent as a prefix of several paths) going to the path whose own call is latest. So when the final
call lies on several paths, its path is the latest of them, and at ``j_max = 1`` that one is kept; token ids
never break a tie::

    c0: s q | a b      c2 re-sends "s q a", a prefix of both paths; J_max = 1 keeps c1's path
    c1: s q | a x      (latest own call), even where "a x" sorts before "a b"
    c2: s q | a        (final)

Invariants
- At most ``j_max`` paths are kept (all when ``j_max`` is None); kept + dropped = all leaves, disjoint.
- Under the ``final_*`` rules the final call's path is always kept; the order is deterministic and total.
- A tie in recency is impossible: the latest path wins every tie that the rule's own keys leave open.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from gyre_hpc.trajectory.tree import RunTree

Rule = Literal["final_then_recent", "final_then_longest", "longest"]


def generated_per_leaf(tree: RunTree) -> np.ndarray:
    """Generated (trainable) tokens on each root-to-leaf path."""
    gen = tree.nodes.generated
    return np.array([sum(int(gen[n:n + k].sum()) for n, _, k in tree.pieces(i)) for i in range(tree.n_leaves)])


def rank_leaves(tree: RunTree, rule: Rule) -> list[int]:
    """All leaves, most wanted first."""
    leaves = np.arange(tree.n_leaves)
    recency = -tree.leaf_recency
    final = int(tree.call_leaf[-1])
    not_final = (leaves != final).astype(np.int64)
    if rule == "final_then_recent":
        keys = (recency, not_final)
    elif rule == "final_then_longest":
        keys = (recency, -generated_per_leaf(tree), not_final)
    elif rule == "longest":
        keys = (recency, -generated_per_leaf(tree))
    else:
        raise ValueError(f"unknown selection rule {rule!r}")
    return np.lexsort(keys).tolist()  # the last key is the primary one


def select_paths(tree: RunTree, j_max: int | None, rule: Rule) -> tuple[list[int], list[int]]:
    """(kept leaves in priority order, dropped leaves)."""
    ranked = rank_leaves(tree, rule)
    cut = len(ranked) if j_max is None else j_max
    return ranked[:cut], ranked[cut:]
