"""Which runs train and with which score.

================== ============ ==================== ======================================
status             score        trains               group statistics
================== ============ ==================== ======================================
scored             [0, 1]       yes (a 0 trains)     yes
timeout_partial    [0, 1]       yes, partial score   yes
timeout_unscorable null         no (counted)         no
eval_failure       null         no (counted)         no — never treated as a score of 0
aborted            null         no (counted)         no
================== ============ ==================== ======================================

Invariants
- A run trains only with a real score; a run without one is excluded from training and from the statistics of
  its group, and the reason is its status, counted separately.
"""
from __future__ import annotations

from gyre_hpc.trajectory.records import Outcome, RunStatus


def training_score(outcome: Outcome) -> float | None:
    """The score a run trains with, or None when the run is excluded."""
    return outcome.score if RunStatus(outcome.status).has_score else None


def exclusion_reason(outcome: Outcome) -> str | None:
    """None for a run that can train, else the status that excludes it."""
    return None if RunStatus(outcome.status).has_score else RunStatus(outcome.status).value
