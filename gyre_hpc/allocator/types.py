"""Shared vocabulary of the allocator: cell roles and the orders a policy emits.

Invariants
- Orders are immutable plain data; a policy communicates only through them.
- ``Role.transition`` is true exactly for the two transition roles (DRAINING, LOADING).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    """What a cell does now. DRAINING = rollout→training switch under way, LOADING = training→rollout."""

    ROLLOUT = "rollout"
    TRAIN = "train"
    DRAINING = "draining"
    LOADING = "loading"
    LOST = "lost"

    @property
    def transition(self) -> bool:
        return self in TRANSITIONS


TRANSITIONS = frozenset({Role.DRAINING, Role.LOADING})


@dataclass(frozen=True)
class Switch:
    """Move ``cell`` to ``target`` (Role.TRAIN or Role.ROLLOUT); the executor runs the transition."""

    cell: int
    target: Role


@dataclass(frozen=True)
class Admit:
    """Start ``queries`` new queries (each a group of runs) on the rollout cells."""

    queries: int


@dataclass(frozen=True)
class WakeAt:
    """Ask to be consulted again at time ``t`` even if no event happens (a time-based condition ripens)."""

    t: float


Order = Switch | Admit | WakeAt
