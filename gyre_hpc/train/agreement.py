"""Train-inference agreement: the engine's per-token logprobs against the trainer's, on the same weights.

A trained token was sampled by an engine at generation version ``g`` (``PackedBatch.version``) and carries the
engine's logprob (``PackedBatch.old_logprob``). In the first forward of an optimizer step, before any update of
that step, the trainer holds version ``v`` and computes its own logprob of the token. Only where ``g == v`` do
the two numbers come from the same weights; there ``|engine - trainer|`` measures the numerical disagreement of
the two stacks (kernels, batching, precision, a sampling temperature the trainer does not apply)::

    token       t0     t1     t2     t3
    version     3      3      2      3        trainer at v = 3: t2 is stale and does not qualify
    engine    -1.20  -0.31  -2.00  -0.70
    trainer   -1.21  -0.31  -1.50  -0.69      diffs 0.01, 0.00, 0.01 → mean 0.0067, max 0.01, tokens 3

A record is ``{"logprob_abs_diff_mean", "logprob_abs_diff_max", "logprob_abs_diff_tokens"}``: one per group, per
optimizer step (metrics.jsonl) and per run (summary.json). The mean and max are ``None`` when no token
qualified (never 0: "no evidence" is not "perfect agreement").

Invariants (tests/unit/test_agreement.py)
- ``combine`` of records equals ``record`` over the union of their tokens: means weighted by token counts, the
  max of maxima, counts added; records without tokens change nothing.
- Only tokens whose generation version equals the trainer's version count.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

KEYS = ("logprob_abs_diff_mean", "logprob_abs_diff_max", "logprob_abs_diff_tokens")


def record(trainer: np.ndarray, engine: np.ndarray, gen_version: np.ndarray, version: int) -> dict:
    """The agreement record of the tokens given as parallel arrays (trained tokens only)."""
    same = np.asarray(gen_version) == version
    diff = np.abs(np.asarray(trainer, np.float64)[same] - np.asarray(engine, np.float64)[same])
    if diff.size == 0:
        return empty()
    return {KEYS[0]: float(diff.mean()), KEYS[1]: float(diff.max()), KEYS[2]: int(diff.size)}


def empty() -> dict:
    return {KEYS[0]: None, KEYS[1]: None, KEYS[2]: 0}


def combine(records: Iterable[dict]) -> dict:
    """One record over all tokens of ``records`` (missing keys count as no token)."""
    n, total, top = 0, 0.0, None
    for r in records:
        k = int(r.get(KEYS[2]) or 0)
        if k == 0:
            continue
        n += k
        total += float(r[KEYS[0]]) * k
        top = float(r[KEYS[1]]) if top is None else max(top, float(r[KEYS[1]]))
    return empty() if n == 0 else {KEYS[0]: total / n, KEYS[1]: top, KEYS[2]: n}
