"""Branch kinds, recognised from token structure alone (no harness metadata).

Each call is compared with the earlier call ``P`` that shares the longest prefix with it (ties: a call that is
a whole prefix of it, else the most recent). Let ``m`` be that shared length. A *context* is a chain of
continuations and retries; its *opening* is the input of the call that started it. ``S`` is a system prompt,
``Q`` the task, ``a`` model output, ``t`` tool output, ``Z`` a summary written by the harness::

    CONTINUATION  P is a prefix of c (m == len(P))         P: S Q | a1        c: S Q a1 t1 | a2
    RETRY         diverges at or after P's opening         P: S Q a1 t1 | a2  c: S Q a1 t1 | a2'
    COMPRESSION   shares only part of the opening (S),     P: S Q a1 t1 | a2  c: S Z | a3
                  and P's context never continues later
    SUBAGENT      shares only part of the opening (S)      P: S Q a1 | a2     c: S Q' | b1 ... then S Q a1 a2 t | a3
                  and P's context continues after c;
                  or shares nothing at all (m == 0)        P: S Q a1 | a2     c: S' Q' | b1

The first call of a run is the ROOT. Retry, compression and subagent calls open a new branch of the tree.
Limits (what the tokens cannot tell): a compression that keeps the task verbatim (``S Q Z``) shares the
whole opening and is named RETRY; subagents that run strictly one after another, with no call of their parent
in between, name the second a COMPRESSION. Kinds label reports only; selection and training do not use them.

Invariants
- Every call gets exactly one kind; only the first call is ROOT; CONTINUATION iff an earlier call that shares
  the longest prefix with it is a whole prefix of it (a call that extends one call but diverges from a later,
  longer one is a RETRY of that one).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gyre_hpc.trajectory.records import Call
from gyre_hpc.trajectory.tree import RunTree


class BranchKind(str, enum.Enum):
    ROOT = "root"
    CONTINUATION = "continuation"
    RETRY = "retry"
    COMPRESSION = "compression"
    SUBAGENT = "subagent"


@dataclass(frozen=True)
class Branch:
    call_id: str
    kind: BranchKind
    source: str | None  # call id of P, the earlier call it shares the most with (None for the root)
    shared: int  # m: tokens shared with P


def lcp_to_all(tree: RunTree, c: int) -> np.ndarray:
    """LCP of call ``c``'s sequence with every call's (by file index), from the sorted-neighbour LCPs."""
    r, lcp = int(tree.call_rank[c]), tree.sorted_lcp
    down = np.minimum.accumulate(lcp[1:r + 1][::-1])[::-1]  # ranks 0..r-1
    up = np.minimum.accumulate(lcp[r + 1:])  # ranks r+1..
    by_rank = np.concatenate([down, [tree.call_len[c]], up])
    return by_rank[tree.call_rank]


def classify(tree: RunTree, calls: Sequence[Call]) -> tuple[Branch, ...]:
    kinds: list[BranchKind] = [BranchKind.ROOT]
    sources: list[int] = [-1]
    shared: list[int] = [0]
    context, opening = [0], [int(tree.call_in_len[0])]
    for c in range(1, len(calls)):
        to_earlier = lcp_to_all(tree, c)[:c]
        m = int(to_earlier.max())
        cands = np.flatnonzero(to_earlier == m)
        prefixes = cands[tree.call_len[cands] == m]
        p = int(prefixes[-1] if prefixes.size else cands[-1])
        if m == 0:
            kind = BranchKind.SUBAGENT
        elif prefixes.size:
            kind = BranchKind.CONTINUATION
        elif m >= opening[context[p]]:
            kind = BranchKind.RETRY
        else:
            kind = BranchKind.COMPRESSION  # provisional: SUBAGENT if P's context continues later
        if kind in (BranchKind.CONTINUATION, BranchKind.RETRY):
            context.append(context[p])
        else:
            context.append(len(opening))
            opening.append(int(tree.call_in_len[c]))
        kinds.append(kind)
        sources.append(p)
        shared.append(m)
    for c, kind in enumerate(kinds):
        if kind is BranchKind.COMPRESSION:
            old = context[sources[c]]
            if any(context[u] == old and kinds[u] in (BranchKind.CONTINUATION, BranchKind.RETRY)
                   for u in range(c + 1, len(calls))):
                kinds[c] = BranchKind.SUBAGENT
    return tuple(Branch(calls[c].call_id, kinds[c], calls[sources[c]].call_id if sources[c] >= 0 else None,
                        shared[c]) for c in range(len(calls)))
