"""Hand-built PackedBatch pairs for the training tests: the same paths packed as tree rows and as flat rows.

A *fork group* is one run whose paths share a prefix and then branch once::

    tree row (one group)                     flat rows (one per path)
      p0 p1 p2 ─ b0 b1        (branch 0)       p0 p1 p2 b0 b1
               ├ c0 c1 c2     (branch 1)       p0 p1 p2 c0 c1 c2
               └ d0           (branch 2)       p0 p1 p2 d0

The first ``prompt`` prefix tokens are the prompt (never trained); the other prefix tokens are generated and
trained once (in the tree row, and in the first flat row only); every branch token is trained. All tokens of a
group carry the group's advantage.
"""
from __future__ import annotations

import numpy as np

from gyre_hpc.trajectory.batch import PackedBatch


def _row(tokens, parent, loss_mask, adv, old):
    n = len(tokens)
    parent = np.asarray(parent, dtype=np.int64)
    pos = np.zeros(n, dtype=np.int64)
    span = np.arange(n, dtype=np.int64)
    for i in range(n):
        if parent[i] >= 0:
            pos[i] = pos[parent[i]] + 1
    for i in range(n - 1, -1, -1):  # children follow parents in pre-order: propagate span ends upwards
        if parent[i] >= 0:
            span[parent[i]] = max(span[parent[i]], span[i])
    return dict(input_ids=np.asarray(tokens), position_ids=pos, parent=parent, span_end=span,
                loss_mask=np.asarray(loss_mask, np.float32), advantage=np.asarray(adv, np.float32),
                old_logprob=np.asarray(old, np.float32), version=np.where(np.asarray(loss_mask) > 0, 0, -1))


def _stack(rows) -> PackedBatch:
    L = max(len(r["input_ids"]) for r in rows)
    out = {}
    for k in rows[0]:
        arr = np.zeros((len(rows), L), dtype=rows[0][k].dtype)
        if k == "parent":
            arr[:] = -1
        if k == "version":
            arr[:] = -1
        if k == "span_end":
            arr[:] = np.arange(L)
        for r, row in enumerate(rows):
            arr[r, : len(row[k])] = row[k]
        out[k] = arr
    return PackedBatch(**out, lengths=np.array([len(r["input_ids"]) for r in rows], dtype=np.int64)).validate()


def fork_pair(groups, seed=0, vocab=256, old_logprob=-1.0):
    """``groups``: list of ``(prompt, prefix_len, [branch_len, ...], advantage)``. Returns (tree, flat)."""
    rng = np.random.default_rng(seed)
    tree_rows, flat_rows = [], []
    for prompt, plen, blens, adv in groups:
        prefix = list(rng.integers(0, vocab, plen))
        branches = [list(rng.integers(0, vocab, b)) for b in blens]
        gen_prefix = [0.0] * prompt + [1.0] * (plen - prompt)
        gen_prefix[0] = 0.0  # the root has no parent: it is never trained
        toks, par, mask = list(prefix), [-1] + list(range(plen - 1)), list(gen_prefix)
        for br in branches:
            start = len(toks)
            toks += br
            par += [plen - 1] + list(range(start, start + len(br) - 1))
            mask += [1.0] * len(br)
        tree_rows.append(_row(toks, par, mask, [adv] * len(toks), [old_logprob] * len(toks)))
        for k, br in enumerate(branches):
            n = plen + len(br)
            m = (gen_prefix if k == 0 else [0.0] * plen) + [1.0] * len(br)
            flat_rows.append(_row(prefix + br, [-1] + list(range(n - 1)), m, [adv] * n, [old_logprob] * n))
    return _stack(tree_rows), _stack(flat_rows)
