"""Staleness: the admission window that enforces the target mean policy-version lag, and its measurement.

Definition. A token generated with policy version ``g`` and trained by the optimizer step that starts from
version ``v`` has lag ``d = v - g`` (fully on-policy training has d = 0). A run generated across several
versions has tokens of several versions. We report the mean per token, the mean per sample (a run: the
mean of its tokens' lags), and the per-token p50, p99 and max.

Enforcement. Generation may run ahead of training only by a window of admitted-but-untrained groups.
The window starts at the prior ``B * (1 + prior * target)`` and is corrected by integral feedback on the
measured batch lags::

    window = clamp(B * (1 + prior * target + gain * n * (target - E[d])), B, max_window)

with n the trained batches and E[d] the token-weighted mean lag of every token trained so far -- the quantity
that is reported and held to the target -- so staler training shrinks the window and fresher grows it.
A streaming policy leaves out the batches trained from version 0 (``SchedState.feedback_lag``): their lag is
0 whatever was admitted (no older version exists), so counting them only winds the window up -- by
``gain * B * target`` after the first step, groups that are trained 2-4 steps later, before the integral can
see them; 6-step live gyre runs ended 13-32% over target that way (issue 13; benchmarks/results/live_staleness_cause.md).
A fixed-batch policy keeps them: its lags are a sawtooth of whole batches (0, 1, ... then 0 again) whose first
tooth is the on-policy batch, and its window moves only by whole batches. The
plain mean of the n batch means (``sum_k lag_k / n``) is used only where no token counts were reported; it is
not the same quantity: a streaming policy trains in completion order, so its first batches hold the short
runs (few tokens, fresh) and its later ones the long runs (many tokens, stale), and the plain mean of batch
means understated gyre's E[d] (live, 6 steps at target 0.5: 0.68 against 0.73 measured, issue 13). The prior depends on
the order in which groups are trained (``prior_for``): a fixed batch is trained in admission order, so with
N groups in flight a token waits about N / (2B) steps (Little's law, prior 2); a streaming policy trains in
completion order, so the long runs of every admitted group wait for the short runs of later ones and each
group in flight costs more lag (prior 1.5, measured in the simulator: with prior 2 gyre overshot a target of
1.0 by 19% on configs/sim/small.yaml, its 12 steps too few for the integral term to correct it).

Hard bounds. ``staleness_max`` caps the mean: while the measured running mean is at or above it, the window
is one batch (generation stops running ahead). ``max_staleness`` masks tokens whose own lag exceeds it out
of the loss; trained lag never exceeds it.

Measurement. ``token_lags`` is the one definition of a batch's lag, used by the simulator's ``LagLedger``
and by the live trainer (``live/dataplane.lag_stats``): the sum over trained tokens of ``v - g``, their count
and the maximum. E[d] of a run is the token-weighted mean over all its steps.

Invariants
- ``admission_window`` is at least one batch (training can never starve) and at most ``max_window``.
- The window's feedback and the ``staleness_max`` cap read the token-weighted E[d] (``SchedState.measured_lag``)
  whenever token counts were reported, the same number ``LagLedger`` and the live summary report; a streaming
  window's feedback leaves out the batches trained from version 0 (lag 0 by construction), the cap never does.
- ``LagLedger`` never records a trained token with lag above ``max_staleness`` (those are counted as masked).
- Per-token statistics weight every token equally; per-sample statistics weight every run equally.
- ``comparable`` is symmetric; a benchmark marks a ratio whose two E[d] are not comparable as "not comparable".
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from gyre_hpc.allocator.state import SchedState


#: the window's prior (batches of lag per unit of target) by training order; see the module docstring
PRIOR_FIXED_BATCHES, PRIOR_STREAMING = 2.0, 1.5


def prior_for(streaming: bool) -> float:
    return PRIOR_STREAMING if streaming else PRIOR_FIXED_BATCHES


def admission_window(state: SchedState, batch: int, target: float, gain: float, max_window: int,
                     prior: float = PRIOR_FIXED_BATCHES, cap: float | None = None, streaming: bool = False) -> int:
    """Admitted-but-untrained groups allowed now (see the module docstring); ``cap`` = ``staleness_max``."""
    measured = state.measured_lag  # token-weighted, as E[d] is reported (not the plain mean of batch means)
    if cap is not None and state.trained_batches and measured >= cap:
        return batch
    batches, fed = state.feedback_lag if streaming else (state.trained_batches, measured)
    error = batches * (target - fed)
    window = batch * (1.0 + prior * target + gain * error)
    return int(min(max(round(window), batch), max_window))


def token_lags(train_version: int, versions, tokens=None) -> tuple[float, float, int]:
    """(lag sum, token count, max lag) of tokens generated at ``versions`` (``tokens[i]`` of each, default 1)
    trained from ``train_version``. Raises ValueError on a token newer than the training version.

    A numpy array (the live trainer: one entry per token) is summed vectorized; a short list (the simulator:
    one entry per version a run spans) in plain Python, which is ten times faster for a few entries."""
    if isinstance(versions, np.ndarray):
        if versions.size == 0:
            return 0.0, 0.0, 0
        lag = train_version - versions.astype(np.int64)
        weight = np.ones(lag.size) if tokens is None else np.asarray(tokens, dtype=float)
        low, total, count, top = int(lag.min()), float((lag * weight).sum()), float(weight.sum()), int(lag.max())
    else:
        total = count = 0.0
        low, top = 0, 0
        for v, w in zip(versions, repeat(1.0) if tokens is None else tokens):
            d = train_version - v
            total += d * w
            count += w
            if d > top:
                top = d
            elif d < low:
                low = d
    if low < 0:
        raise ValueError(f"negative lag: tokens of version {train_version - low} trained at {train_version}")
    return total, count, top


#: two runs are compared at matched staleness when their measured E[d] differ by at most this fraction
MATCH_TOLERANCE = 0.1


def comparable(d_ref: float, d_other: float, tol: float = MATCH_TOLERANCE) -> bool:
    """Whether two measured mean staleness values are matched: they differ by at most ``tol`` of the larger."""
    return abs(d_other - d_ref) <= tol * max(abs(d_ref), abs(d_other)) + 1e-12


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
        if bound is not None and any(train_version - v > bound for v in versions):
            kept = [(v, t) for v, t in zip(versions, tokens) if train_version - v <= bound]
            self.masked_tokens += sum(tokens) - sum(t for _, t in kept)
            versions, tokens = [v for v, _ in kept], [t for _, t in kept]
        lag_tok, tok_sum, top = token_lags(train_version, versions, tokens)  # raises on a negative lag
        if top >= len(hist):
            hist.extend([0.0] * (top + 1 - len(hist)))
        for v, tok in zip(versions, tokens):
            hist[train_version - v] += tok
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
