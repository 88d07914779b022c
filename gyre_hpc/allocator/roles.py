"""Cell roles over time from a live run's allocator event log (``events.jsonl``): spans and shares. Core (stdlib).

A cell is in its ``start`` role until a switch ``order`` puts it in ``draining`` (to train) or ``loading`` (to
rollout); its ``switch_done`` puts it in the new role; ``lost`` ends it. ``role_share`` is each role's fraction
of all cell-time (the title of roles.png, and the summary's ``role_share``).

Invariants (tests/unit/test_roles.py)
- Per cell the spans tile [start, last event] without gaps or overlaps, so the shares of the roles sum to 1
  (when any time passed).
- Every role of ``ROLES`` is a key of ``role_share``, 0.0 when the run never entered it.
"""
from __future__ import annotations

from typing import Sequence

ROLES = ("rollout", "train", "draining", "loading", "lost")


def role_spans(events: Sequence[dict], cells: int) -> list[list[tuple[float, float, str]]]:
    """Per cell, (start, end, role) spans from the allocator's event log."""
    start = next((e for e in events if e["event"] == "start"), {"roles": ["rollout"] * cells, "t": 0.0})
    end_t = max((e["t"] for e in events), default=0.0)
    role = list(start["roles"])
    since = [start["t"]] * cells
    spans: list[list] = [[] for _ in range(cells)]

    def move(c: int, t: float, new: str) -> None:
        spans[c].append((since[c], t, role[c]))
        role[c], since[c] = new, t

    for e in events:
        if e["event"] == "order" and e.get("order") == "switch":
            move(e["cell"], e["t"], "draining" if e["target"] == "train" else "loading")
        elif e["event"] == "switch_done":
            move(e["cell"], e["t"], e["role"])
        elif e["event"] == "lost":
            move(e["cell"], e["t"], "lost")
    for c in range(cells):
        spans[c].append((since[c], end_t, role[c]))
    return spans


def role_share(events: Sequence[dict], cells: int, digits: int = 4) -> dict[str, float]:
    """Each role's share of all cell-time (rounded to ``digits``); all zeros when no time passed."""
    total = {r: 0.0 for r in ROLES}
    for spans in role_spans(events, cells):
        for a, b, r in spans:
            total[r] = total.get(r, 0.0) + (b - a)
    whole = sum(total.values())
    return {r: round(t / whole, digits) if whole > 0 else 0.0 for r, t in total.items()}
