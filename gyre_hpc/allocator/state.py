"""Plain-data scheduling state that the simulator (virtual time) or the live allocator (wall clock) updates.

The state holds facts, never decisions: cell roles, unfinished runs per cell, group counts, the training
progress of the current burst, the policy version and the staleness bookkeeping. Policies read it; only
the executor (simulator or live allocator) writes it, through the small methods below.

Invariants
- ``ready_since(x)`` is the earliest time since which the ready-group count has been >= x without
  interruption, or None when it is below x now. It is kept in a monotone stack (O(1) amortized per change,
  O(log n) per query) and needs no clock.
- ``unfinished_runs == sum(cell.runs) + parked_runs`` (runs on no cell are parked, waiting for a rollout
  cell); the executor keeps the counters, ``check()`` verifies them.
- ``burst_steps`` counts optimizer steps since training cells last went from none to some.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gyre_hpc.allocator.types import TRANSITIONS, Role


@dataclass
class CellState:
    """One cell: its role, the unfinished runs it serves, and when its role last changed."""

    role: Role = Role.ROLLOUT
    runs: int = 0
    since: float = 0.0


@dataclass
class SchedState:
    """Everything a policy may look at. All counts are of groups (queries) unless named ``runs``."""

    cells: list[CellState]
    core: int = 0
    runs_per_query: int = 1
    version: int = 0
    steps_done: int = 0
    admitted_queries: int = 0
    inflight_groups: int = 0       # admitted, not all runs finished
    ready_groups: int = 0          # all runs finished, not yet consumed by an optimizer step
    unprocessed_groups: int = 0    # groups handed to the trainer whose forward/backward has not finished
    backlog_work_s: float = 0.0    # cell-seconds of training work in the unprocessed ready groups
    step_groups: int = 0           # groups processed toward the current optimizer step
    burst_steps: int = 0           # optimizer steps since the training side last (re)started
    optimizing: bool = False       # an optimizer step is being applied on the core
    parked_runs: int = 0           # unfinished runs on no cell (no rollout cell had room, or paused)
    unfinished_runs: int = 0       # admitted runs that have not ended (on a cell or parked)
    trained_batches: int = 0
    lag_sum: float = 0.0           # sum over trained batches of the batch's mean per-token lag
    lag_token_sum: float = 0.0     # sum over trained tokens of their lag (0 with lag_tokens 0: not reported)
    lag_tokens: float = 0.0        # trained tokens whose lag was reported
    onpolicy_batches: int = 0      # trained batches from version 0: lag 0 by construction (no older version)
    onpolicy_tokens: float = 0.0   # their reported tokens (their lag sum is 0)
    _ready_t: list[float] = field(default_factory=lambda: [0.0])   # monotone stack: since when ...
    _ready_c: list[int] = field(default_factory=lambda: [0])       # ... the count has been >= this

    # ------------------------------------------------------------------ queries used by policies
    def cells_in(self, *roles: Role) -> list[int]:
        return [i for i, c in enumerate(self.cells) if c.role in roles]

    @property
    def in_transition(self) -> bool:
        for c in self.cells:
            if c.role in TRANSITIONS:
                return True
        return False

    @property
    def training_cells(self) -> list[int]:
        return self.cells_in(Role.TRAIN)

    def ready_since(self, threshold: float) -> float | None:
        """Earliest time since which ready_groups >= threshold continuously; None if below now."""
        if self.ready_groups < threshold:
            return None
        return self._ready_t[bisect.bisect_left(self._ready_c, threshold)]

    # ------------------------------------------------------------------ updates by the executor
    def set_ready(self, count: int, now: float) -> None:
        """Record that ready_groups became ``count`` at ``now`` (keeps the monotone stack)."""
        times, counts = self._ready_t, self._ready_c
        since = now
        while counts and counts[-1] > count:
            counts.pop()
            since = times.pop()  # the count has been above the new value since then
        if not counts or counts[-1] < count:
            counts.append(count)
            times.append(since)
        self.ready_groups = count

    def set_role(self, cell: int, role: Role, now: float) -> None:
        had_training = bool(self.training_cells)
        self.cells[cell].role = role
        self.cells[cell].since = now
        if role is Role.TRAIN and not had_training:
            self.burst_steps = 0

    def check(self) -> None:
        """Raise AssertionError if the run counters disagree (used by tests and the live allocator)."""
        on_cells = sum(c.runs for c in self.cells)
        assert self.unfinished_runs == on_cells + self.parked_runs, (
            f"unfinished_runs {self.unfinished_runs} != {on_cells} on cells + {self.parked_runs} parked")

    def record_batch_lag(self, mean_lag: float, tokens: float = 0.0, onpolicy: bool = False) -> None:
        """One trained batch: its mean per-token lag and how many tokens it trained (0: not reported);
        ``onpolicy``: it was trained from version 0, so its lag is 0 whatever was admitted."""
        if onpolicy:
            self.onpolicy_batches += 1
            self.onpolicy_tokens += tokens
        self.trained_batches += 1
        self.lag_sum += mean_lag
        self.lag_token_sum += mean_lag * tokens
        self.lag_tokens += tokens

    @property
    def measured_lag(self) -> float:
        """E[d] so far as it is reported: the token-weighted mean lag of every trained token; the plain mean
        of the batch means where no token counts were reported (0.0 before the first step)."""
        if self.lag_tokens > 0:
            return self.lag_token_sum / self.lag_tokens
        return self.lag_sum / self.trained_batches if self.trained_batches else 0.0

    @property
    def feedback_lag(self) -> tuple[int, float]:
        """(batches, E[d]) of the batches admission could have made staler: every trained batch but those
        trained from version 0 (on-policy by construction), token-weighted as ``measured_lag``."""
        batches = self.trained_batches - self.onpolicy_batches
        if batches <= 0:
            return 0, 0.0
        tokens = self.lag_tokens - self.onpolicy_tokens
        if self.lag_tokens > 0:
            return batches, self.lag_token_sum / tokens if tokens > 0 else 0.0
        return batches, self.lag_sum / batches
