"""How one agent run ended, as its runner reports it: ``AgentResult`` (plugin agents, ``gyre_hpc.agents.plugins``;
mini-swe-agent, ``gyre_hpc.agents.mswea``). Its own module so that both runners import it and not each other.

Invariant: ``status`` is one of finished / timeout / crashed; ``returncode`` is set only for a subprocess agent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AgentResult:
    """How a plugin agent's run ended: finished (returned / exit 0), timeout, or crashed (raised / exit != 0)."""

    status: Literal["finished", "timeout", "crashed"]
    detail: str = ""
    returncode: int | None = None
