"""Lexicographic order and neighbour LCPs of call sequences, without materialising them.

A call's sequence is ``input_ids + output_ids``; in a long agent run every call re-sends the whole context, so
the sequences of a run add up to far more tokens than its tree. ``Seqs`` reads them in place (no concatenated
copies), and ``sort_with_lcp`` inserts each sequence into the sorted list with an LCP-aware binary search
(Manber and Myers): it knows the LCP of the query with both bounds and the LCPs between sorted neighbours, so a
token of the query is compared at most once per insertion beyond ``O(log C)`` probes. Comparisons run over
numpy blocks (growing up to 64 Ki tokens) with an early exit.

Order: a proper prefix sorts before its extensions; equal sequences keep file order (stable).

Invariants
- ``order`` is a permutation with ``seq[order[k-1]] <= seq[order[k]]`` and ``lcp[k]`` is the exact LCP of those
  two (``lcp[0] == 0``); checked against ``sorted`` on concatenated copies in the tests.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_BLOCK0, _BLOCK_MAX = 1024, 1 << 16


class Seqs:
    """Sequences ``inputs[i] + outputs[i]`` read in place."""

    def __init__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]):
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.n_in = [len(a) for a in self.inputs]
        self.length = [a + len(b) for a, b in zip(self.n_in, self.outputs)]

    def __len__(self) -> int:
        return len(self.inputs)

    def view(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Tokens [lo, hi) of sequence i; the range must not cross its input/output boundary."""
        k = self.n_in[i]
        return self.inputs[i][lo:hi] if hi <= k else self.outputs[i][lo - k:hi - k]

    def token(self, i: int, pos: int) -> int:
        k = self.n_in[i]
        return int(self.inputs[i][pos] if pos < k else self.outputs[i][pos - k])

    def copy_into(self, i: int, lo: int, out: np.ndarray) -> None:
        """``out[:] = seq_i[lo:]``."""
        k = self.n_in[i]
        head = self.inputs[i][lo:] if lo < k else self.inputs[i][:0]
        out[:len(head)] = head
        out[len(head):] = self.outputs[i][max(0, lo - k):]

    def lcp(self, i: int, j: int, start: int = 0) -> int:
        """Longest common prefix of sequences i and j, given that they agree on the first ``start`` tokens."""
        n = min(self.length[i], self.length[j])
        pos, block = start, _BLOCK0
        while pos < n:
            end = min(n, pos + block)
            for k in (self.n_in[i], self.n_in[j]):
                if pos < k < end:
                    end = k
            neq = self.view(i, pos, end) != self.view(j, pos, end)
            first = int(neq.argmax())
            if neq[first]:
                return pos + first
            pos, block = end, min(2 * block, _BLOCK_MAX)
        return n

    def after(self, q: int, j: int, common: int) -> bool:
        """Whether q sorts after j (ties: True), given their LCP ``common``."""
        if common == self.length[j]:
            return True  # j is a prefix of q, or equal
        if common == self.length[q]:
            return False  # q is a proper prefix of j
        return self.token(q, common) > self.token(j, common)


def sort_with_lcp(seqs: Seqs) -> tuple[np.ndarray, np.ndarray]:
    """(order, lcp): file indices in lexicographic order, and the LCP of each with its sorted predecessor."""
    order: list[int] = []
    nl: list[int] = []  # nl[k] = lcp(order[k-1], order[k]); nl[0] = 0

    def between(a: int, b: int) -> int:  # lcp(order[a], order[b]) for a < b (a may be -1: nothing shared)
        return 0 if a < 0 else min(nl[a + 1:b + 1])

    for q in range(len(seqs)):
        lo, hi, llo, lhi = -1, len(order), 0, 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if llo >= lhi:
                m, known = between(lo, mid), llo
            else:
                m, known = between(mid, hi), lhi
            if m != known:  # decided by the bound that shares more with q
                goes_right = (m > known) == (llo >= lhi)
                if goes_right:
                    lo, llo = mid, (llo if llo >= lhi else m)
                else:
                    hi, lhi = mid, (m if llo >= lhi else lhi)
                continue
            common = seqs.lcp(q, order[mid], known)
            if seqs.after(q, order[mid], common):
                lo, llo = mid, common
            else:
                hi, lhi = mid, common
        order.insert(hi, q)
        if hi < len(nl):
            nl[hi] = lhi
        nl.insert(hi, llo if lo >= 0 else 0)
    return np.array(order, np.int64), np.array(nl, np.int64)
