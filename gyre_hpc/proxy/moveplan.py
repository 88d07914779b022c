"""The mover seam's types: what a move asks of a mover (``MovePlan``), what it cost (``MoveCost``), and the
``Mover`` protocol (``gyre_hpc.proxy.movers``: the seam and the re-prefill mover; ``gyre_hpc.proxy.kvmover``: KV
blocks over Mooncake). Pure data, no I/O; its own module so that the two movers import it and not each other.

Invariant: ``reprefill_tokens + moved_tokens == len(plan.tokens)`` for every ``MoveCost`` a mover returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MovePlan:
    rid: str  # the harness call
    source: str  # engine name
    source_url: str
    source_alive: bool  # false when the source died (no KV to take)
    target: str
    target_url: str
    tokens: tuple[int, ...]  # prompt + partial output: the prefix the target continues from


@dataclass(frozen=True)
class MoveCost:
    reprefill_tokens: int  # prefix tokens the target recomputes
    moved_tokens: int  # prefix tokens whose KV blocks were transferred
    seconds: float  # time prepare() took


class Mover(Protocol):
    name: str

    async def prepare(self, plan: MovePlan) -> MoveCost: ...
