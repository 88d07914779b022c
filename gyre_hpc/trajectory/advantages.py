"""Group-relative advantages (GRPO-style) over the runs of one query.

::

    group q0: runs r0 r1 r2 r3 with scores 1.0 0.0 0.5 eval_failure
    mean over the scorable runs r0..r2 = 0.5, std (population) = 0.408
    mean:      A = score - mean                 → +0.5 -0.5  0.0   (r3: excluded, no advantage)
    mean_std:  A = (score - mean) / (std + eps) → +1.22 -1.22 0.0

Invariants
- Only runs with a score (``scoring.training_score`` not None) enter a group's mean and std, and only they get
  an advantage.
- A group whose scorable runs all have the same score (including a group of one) has no signal: ``drop`` gives
  its runs no advantage (they do not train), ``keep`` gives each advantage 0.0.
- The mean advantage of a kept group is 0 (up to rounding).
"""
from __future__ import annotations

from typing import Literal, Mapping

import numpy as np


def group_advantages(
    scores: Mapping[str, tuple[str, float | None]],
    norm: Literal["mean", "mean_std"] = "mean_std",
    eps: float = 1e-6,
    equal_groups: Literal["drop", "keep"] = "drop",
) -> tuple[dict[str, float], list[str]]:
    """``scores``: run id → (query id, score or None). Returns (run id → advantage, dropped query ids)."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for run, (query, score) in scores.items():
        if score is not None:
            groups.setdefault(query, []).append((run, score))
    advantages, dropped = {}, []
    for query, members in groups.items():
        s = np.array([score for _, score in members], np.float64)
        if s.max() == s.min():
            if equal_groups == "drop":
                dropped.append(query)
                continue
            adv = np.zeros_like(s)
        else:
            adv = s - s.mean()
            if norm == "mean_std":
                adv = adv / (s.std() + eps)
        advantages.update({run: float(a) for (run, _), a in zip(members, adv)})
    return advantages, dropped
