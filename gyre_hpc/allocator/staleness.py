"""Staleness: the admission window that enforces the target mean policy-version lag, and its measurement.

Definition. A token generated with policy version ``g`` and trained by the optimizer step that starts from
version ``v`` has lag ``d = v - g`` (fully on-policy training has d = 0). A run generated across several
versions has tokens of several versions. We report the mean per token, the mean per sample (a run: the
mean of its tokens' lags), and the per-token p50, p99 and max.

Enforcement. Generation may run ahead of training only by a window of admitted-but-untrained groups.
The window starts at the prior ``B * (1 + 2 * target)`` (Little's law: with N groups in flight a token
waits about N / (2B) steps) and is corrected by integral feedback on the measured batch lags::

    window = clamp(B * (1 + 2 * target + gain * sum_k (target - lag_k)), B, max_window)

so batches that were staler than the target shrink the window and fresher ones grow it. The optional hard
bound ``max_staleness`` masks tokens older than the bound out of the loss; trained lag never exceeds it.

Invariants
- ``admission_window`` is at least one batch (training can never starve) and at most ``max_window``.
- ``LagLedger`` never records a trained token with lag above ``max_staleness`` (those are counted as masked).
- Per-token statistics weight every token equally; per-sample statistics weight every run equally.
"""
from __future__ import annotations

import numpy as np

from gyre_hpc.allocator.state import SchedState


def admission_window(state: SchedState, batch: int, target: float, gain: float, max_window: int) -> int:
    """Admitted-but-untrained groups allowed now (see the module docstring)."""
    error = state.trained_batches * target - state.lag_sum
    window = batch * (1.0 + 2.0 * target + gain * error)
    return int(min(max(round(window), batch), max_window))


class LagLedger:
    """Accumulates the lag of every trained token: an integer histogram plus per-sample means."""

    def __init__(self, max_staleness: int | None = None):
        self.max_staleness = max_staleness
        self.hist: list[float] = []
        self.sample_means: list[float] = []
        self.masked_tokens = 0.0

    def add_run(self, train_version: int, versions: list[int], tokens: list[float]) -> tuple[float, float]:
        """Record one run's tokens (``tokens[i]`` generated at ``versions[i]``); returns (mean lag, tokens)."""
        hist, bound = self.hist, self.max_staleness
        lag_tok = tok_sum = 0.0
        for v, tok in zip(versions, tokens):
            lag = train_version - v
            if lag < 0:
                raise ValueError(f"negative lag: tokens of version {v} trained at {train_version}")
            if bound is not None and lag > bound:
                self.masked_tokens += tok
                continue
            while len(hist) <= lag:
                hist.append(0.0)
            hist[lag] += tok
            lag_tok += lag * tok
            tok_sum += tok
        if tok_sum <= 0:
            return 0.0, 0.0
        mean = lag_tok / tok_sum
        self.sample_means.append(mean)
        return mean, tok_sum

    def stats(self) -> dict[str, float]:
        hist = np.asarray(self.hist, dtype=float)
        total = hist.sum()
        if total <= 0:
            return {"staleness_mean": 0.0, "staleness_sample_mean": 0.0, "staleness_p50": 0.0,
                    "staleness_p99": 0.0, "staleness_max": 0.0, "masked_token_frac": 0.0}
        lag = np.arange(hist.size)
        cdf = np.cumsum(hist) / total
        return {
            "staleness_mean": float((lag * hist).sum() / total),
            "staleness_sample_mean": float(np.mean(self.sample_means)),
            "staleness_p50": float(np.searchsorted(cdf, 0.5 - 1e-12)),
            "staleness_p99": float(np.searchsorted(cdf, 0.99 - 1e-12)),
            "staleness_max": float(lag[hist > 0].max()),
            "masked_token_frac": float(self.masked_tokens / (total + self.masked_tokens)),
        }
