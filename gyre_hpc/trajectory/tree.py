"""The prefix tree of one run: every call's ``input_ids + output_ids`` inserted once, shared prefixes shared.

::

    calls (input | output)          prefix tree, nodes numbered in pre-order
    c0: s q | a b                   0s ─ 1q ─ 2a ─ 3b ─ 4t ─ 5c       c1 continues c0 (c0 is a prefix of c1)
    c1: s q a b t | c                      └─ 6x ─ 7y               c2 retries c0: it diverges after "s q"
    c2: s q | x y

A node is one token in one context (its whole prefix), so the same token id after a different prefix is a
different node. Leaves (paths) are the distinct call sequences that are not a strict prefix of another
call's; identical sequences are one leaf.

Invariants
- Each distinct prefix of every call sequence is exactly one node; every call sequence is a root path of the tree.
- A node is *generated* iff some call produced it as output; only generated nodes are trainable. Tokens that were
  only ever inputs (prompts, tool output, harness summaries) are never generated, so never trained. A root
  (depth 0) is never generated because every call has a non-empty input.
- When several calls generated the same node (identical retry outputs, an output later re-sent as input is the
  same node), its logprob and version come from the first of them in file order.
- Recency is record order (file order: the proxy appends a call when it finishes; timestamps are never
  compared). A call lies on every path its sequence is a prefix of, and counts for each one's
  ``leaf_last_call``. Leaves are ordered by ``leaf_last_call``, ties by ``leaf_own_call`` (the latest call whose
  sequence is the leaf itself; no two leaves share one, so the order is total): ``leaf_recency``. A call that
  lies on several paths belongs to the latest of them (``call_leaf``), whatever their token order::

      c0: s q | a b     leaves A (s q a b, own c0) and B (s q a x, own c1); c2 lies on both, so
      c1: s q | a x     leaf_last_call = [2, 2], the tie goes to B (own call 1 > 0): call_leaf[2] = B
      c2: s q | a
- Arrays are in pre-order: ``parent[i] < i``, ``depth[i] == depth[parent[i]] + 1``, and the subtree of ``i`` is
  exactly the positions ``i..span_end[i]``.

Method (no per-token Python loop): sort the call sequences lexicographically with the LCP of sorted neighbours
(``lexsort``: vectorised block comparisons, sequences read in place); leaf ``k`` then adds the nodes
``seq_k[lcp_k:]`` and the concatenation is the pre-order. Parents of branch starts and subtree ends come
from two monotonic stacks over the leaves (one entry per leaf, not per token), filled in with slices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.records import Call
from gyre_hpc.trajectory.lexsort import Seqs, sort_with_lcp


@dataclass(frozen=True, eq=False)
class TreeArrays:
    """A pre-order serialized token forest (see the module docstring for the invariants)."""

    tokens: np.ndarray  # int64 [N]
    depth: np.ndarray  # int32 [N]
    parent: np.ndarray  # int32 [N], -1 for roots
    span_end: np.ndarray  # int32 [N]
    generated: np.ndarray  # bool [N]
    logprob: np.ndarray  # float32 [N], 0 where not generated
    version: np.ndarray  # int64 [N], -1 where not generated

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, eq=False)
class RunTree:
    nodes: TreeArrays
    gen_call: np.ndarray  # int32 [N]: file index of the call that generated the node, -1 if none
    leaf_call: np.ndarray  # int64 [S]: file index of the call whose sequence is leaf i (leaves in sorted order)
    leaf_len: np.ndarray  # int64 [S]: path length of leaf i
    leaf_pieces: tuple[tuple[tuple[int, int, int], ...], ...]  # per leaf: (start depth, first node, end depth)
    leaf_last_call: np.ndarray  # int64 [S]: largest file index of a call that lies on leaf i's path
    call_leaf: np.ndarray  # int64 [C]: the latest leaf whose path contains call c's sequence (tie rule above)
    call_rank: np.ndarray  # int64 [C]: position of call c in lexicographic order
    sorted_lcp: np.ndarray  # int64 [C]: LCP of sorted neighbours k-1, k (0 at k=0)
    call_len: np.ndarray  # int64 [C]
    call_in_len: np.ndarray  # int64 [C]
    leaf_own_call: np.ndarray  # int64 [S]: largest file index of a call whose sequence is exactly leaf i

    @property
    def leaf_recency(self) -> np.ndarray:
        """Rank of each leaf from the oldest (0) to the latest (S-1): by ``leaf_last_call``, ties by
        ``leaf_own_call`` (a total order: no two leaves share an own call)."""
        rank = np.empty(self.n_leaves, np.int64)
        rank[np.lexsort((self.leaf_own_call, self.leaf_last_call))] = np.arange(self.n_leaves)
        return rank

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_call)

    def pieces(self, leaf: int, lo: int = 0, hi: int | None = None) -> Iterator[tuple[int, int, int]]:
        """(first node, first depth, count) of the contiguous node runs covering depths [lo, hi) of a path."""
        hi = int(self.leaf_len[leaf]) if hi is None else hi
        for start, offset, end in self.leaf_pieces[leaf]:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                yield offset + a - start, a, b - a

    def path_nodes(self, leaf: int) -> np.ndarray:
        """Node indices of a root-to-leaf path, by depth."""
        return np.concatenate([np.arange(n, n + k) for n, _, k in self.pieces(leaf)])

    def keep_mask(self, leaves: Sequence[int]) -> np.ndarray:
        keep = np.zeros(len(self.nodes), bool)
        for leaf in leaves:
            for n, _, k in self.pieces(leaf):
                keep[n:n + k] = True
        return keep

    def restrict(self, leaves: Sequence[int]) -> TreeArrays:
        """The subtree spanned by ``leaves`` (pre-order is kept: it is the full pre-order restricted)."""
        if len(set(leaves)) == self.n_leaves:
            return self.nodes
        keep = self.keep_mask(leaves)
        idx = np.flatnonzero(keep)
        new = np.cumsum(keep) - 1
        t = self.nodes
        par = t.parent[idx]
        return TreeArrays(t.tokens[idx], t.depth[idx], np.where(par >= 0, new[np.maximum(par, 0)], -1),
                          new[t.span_end[idx]], t.generated[idx], t.logprob[idx], t.version[idx])


def _branch_parents(leaf_lcp: np.ndarray, leaf_offset: np.ndarray, leaf_len: np.ndarray) -> tuple[np.ndarray, list]:
    """Left-to-right stack: the parent node of each leaf's first new node, and each leaf's path pieces."""
    parents = np.full(len(leaf_lcp), -1, np.int64)
    stack: list[tuple[int, int]] = []  # (start depth, node offset) of the pieces of the previous path
    pieces = []
    for i, (l, off, n) in enumerate(zip(leaf_lcp.tolist(), leaf_offset.tolist(), leaf_len.tolist())):
        while stack and stack[-1][0] >= l:
            stack.pop()
        if l > 0:
            start, offset = stack[-1]
            parents[i] = offset + l - 1 - start
        stack.append((l, off))
        ends = [s for s, _ in stack[1:]] + [n]
        pieces.append(tuple((s, o, e) for (s, o), e in zip(stack, ends)))
    return parents, pieces


def _span_ends(leaf_lcp: np.ndarray, leaf_len: np.ndarray, leaf_offset: np.ndarray, n: int) -> np.ndarray:
    """Right-to-left stack: a node at depth d of leaf i's new part ends its subtree just before the first later
    leaf that branches at depth <= d (or at the end)."""
    span_end = np.empty(n, np.int32)
    stack: list[tuple[int, int]] = []  # (lcp, offset) of later leaves, lcp increasing towards the top
    for l_i, hi, off in zip(leaf_lcp[::-1].tolist(), leaf_len[::-1].tolist(), leaf_offset[::-1].tolist()):
        base = off - l_i  # node index = base + depth
        for l_e, off_e in reversed(stack):
            lo = max(l_e, l_i)
            span_end[base + lo:base + hi] = off_e - 1
            hi = lo
            if l_e <= l_i:
                break
        span_end[base + l_i:base + hi] = n - 1
        while stack and stack[-1][0] >= l_i:
            stack.pop()
        stack.append((l_i, off))
    return span_end


def build_tree(calls: Sequence[Call]) -> RunTree:
    """The prefix tree of one run's calls (in file order)."""
    if not calls:
        raise TrajectoryError("build_tree: a run without calls has no tree")
    seqs = Seqs([c.input_ids for c in calls], [c.output_ids for c in calls])
    call_len = np.array(seqs.length, np.int64)
    call_in_len = np.array(seqs.n_in, np.int64)
    if call_in_len.min() == 0:
        bad = calls[int(call_in_len.argmin())]
        raise TrajectoryError(f"call {bad.call_id} of run {bad.run_id} (line {bad.line}) has an empty input")
    order, sorted_lcp = sort_with_lcp(seqs)
    sorted_len = call_len[order]
    leaf_pos = np.flatnonzero(np.append(sorted_lcp[1:] < sorted_len[:-1], True))
    leaf_lcp = np.zeros(len(leaf_pos), np.int64)
    if len(leaf_pos) > 1:
        leaf_lcp[1:] = np.minimum.reduceat(sorted_lcp, leaf_pos[:-1] + 1)
    leaf_call, leaf_len = order[leaf_pos], sorted_len[leaf_pos]
    seg_len = leaf_len - leaf_lcp
    leaf_offset = np.concatenate([[0], np.cumsum(seg_len)[:-1]]).astype(np.int64)
    n = int(seg_len.sum())
    tokens = np.empty(n, np.int64)
    for c, l, off, k in zip(leaf_call.tolist(), leaf_lcp.tolist(), leaf_offset.tolist(), seg_len.tolist()):
        seqs.copy_into(c, l, tokens[off:off + k])
    depth = np.arange(n, dtype=np.int32)
    for off, k, shift in zip(leaf_offset.tolist(), seg_len.tolist(), (leaf_offset - leaf_lcp).tolist()):
        depth[off:off + k] -= shift
    parent = np.arange(-1, n - 1, dtype=np.int32)
    seg_parent, pieces = _branch_parents(leaf_lcp, leaf_offset, leaf_len)
    parent[leaf_offset] = seg_parent
    first_leaf = np.empty(len(seqs), np.int64)
    first_leaf[order] = np.searchsorted(leaf_pos, np.arange(len(seqs)))
    call_rank = np.empty(len(seqs), np.int64)
    call_rank[order] = np.arange(len(seqs))
    call_leaf, leaf_last, leaf_own = _attribute(call_len, first_leaf, leaf_len, leaf_lcp)
    empty = TreeArrays(tokens, depth, parent, _span_ends(leaf_lcp, leaf_len, leaf_offset, n),
                       np.zeros(n, bool), np.zeros(n, np.float32), np.full(n, -1, np.int64))
    tree = RunTree(empty, np.full(n, -1, np.int32), leaf_call, leaf_len, tuple(pieces), leaf_last, call_leaf,
                   call_rank, sorted_lcp, call_len, call_in_len, leaf_own)
    _mark_generated(tree, calls)
    return tree


def _attribute(call_len: np.ndarray, first_leaf: np.ndarray, leaf_len: np.ndarray,
               leaf_lcp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(call_leaf, leaf_last_call, leaf_own_call). A call lies on leaf ``first_leaf`` and on each following leaf
    while their LCP with it stays >= its length; on several, it counts for each one's ``leaf_last_call`` and
    belongs to the latest of them."""
    calls = np.arange(len(call_len))
    n_leaves = len(leaf_len)
    own = np.full(n_leaves, -1, np.int64)
    is_own = call_len == leaf_len[first_leaf]  # the call's sequence is the leaf itself
    np.maximum.at(own, first_leaf[is_own], calls[is_own])
    last = own.copy()
    nxt = np.minimum(first_leaf + 1, n_leaves - 1)
    one = is_own | (first_leaf + 1 == n_leaves) | (leaf_lcp[nxt] < call_len)  # on its first leaf only
    np.maximum.at(last, first_leaf[one], calls[one])
    shared = []  # (call, first leaf, end leaf) of the calls on several (contiguous) leaves
    for c in calls[~one].tolist():
        lo = int(first_leaf[c])
        below = np.flatnonzero(leaf_lcp[lo + 1:] < call_len[c])
        hi = lo + 1 + int(below[0]) if len(below) else n_leaves
        last[lo:hi] = np.maximum(last[lo:hi], c)
        shared.append((c, lo, hi))
    call_leaf = first_leaf.copy()
    if shared:
        recency = np.empty(n_leaves, np.int64)
        recency[np.lexsort((own, last))] = np.arange(n_leaves)
        for c, lo, hi in shared:
            call_leaf[c] = lo + int(np.argmax(recency[lo:hi]))
    return call_leaf, last, own


def _mark_generated(tree: RunTree, calls: Sequence[Call]) -> None:
    """Fill generated/logprob/version/gen_call from each call's output span; the first call in file order wins."""
    t = tree.nodes
    for c in range(len(calls) - 1, -1, -1):
        n_in = int(tree.call_in_len[c])
        for node, d, k in tree.pieces(int(tree.call_leaf[c]), n_in, int(tree.call_len[c])):
            o = d - n_in
            tree.gen_call[node:node + k] = c
            t.generated[node:node + k] = True
            t.logprob[node:node + k] = calls[c].output_logprobs[o:o + k]
            t.version[node:node + k] = calls[c].output_versions[o:o + k]
