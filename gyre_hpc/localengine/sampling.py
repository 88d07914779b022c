"""Next-token sampling from one row of logits (numpy), with SGLang's parameter semantics.

Order, as in SGLang: suppressed tokens (stop/EOS before ``min_new_tokens``) → temperature → top-k → top-p →
one draw. ``temperature < 1e-5`` is greedy (argmax), as SGLang treats it.

The returned logprob is ``log_softmax(logits / temperature)[token]`` (raw logits when greedy): the logprob of the
generating policy at that temperature, before top-k/top-p truncation — what SGLang returns by default and what
an importance ratio against the trainer's logprob needs.

Invariants
- The draw consumes exactly one ``rng.random()`` per sampled token (none when greedy), so a request whose
  generator is seeded by ``sampling_seed`` produces the same tokens for the same logits, whatever else the
  engine runs.
- The sampled token always lies in the kept set: never a suppressed token, never outside top-k / top-p
  (top-p keeps the smallest prefix of the sorted distribution whose mass reaches ``top_p``, at least one token).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gyre_hpc.engines.protocol import SamplingParams

GREEDY_BELOW = 1e-5


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - np.max(x)
    return x - np.log(np.sum(np.exp(x)))


def kept_mask(logp: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Boolean mask of the tokens top-k and top-p keep (``logp`` is the temperature-scaled log-distribution)."""
    order = np.argsort(-logp, kind="stable")
    keep = np.zeros(logp.shape[0], dtype=bool)
    n = logp.shape[0] if top_k == -1 else min(top_k, logp.shape[0])
    probs = np.exp(logp[order[:n]])
    if top_p < 1.0:
        # keep token i while the mass before it is still below top_p (the first token is always kept)
        before = np.concatenate(([0.0], np.cumsum(probs)[:-1]))
        n = max(1, int(np.sum(before < top_p)))
    keep[order[:n]] = True
    return keep


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           suppressed: Sequence[int] = ()) -> tuple[int, float]:
    """Draw one token from ``logits`` [vocab]; returns (token, logprob)."""
    logits = np.asarray(logits, dtype=np.float64).copy()
    if len(suppressed):
        logits[np.asarray(suppressed, dtype=np.int64)] = -np.inf
    if params.temperature < GREEDY_BELOW:
        token = int(np.argmax(logits))
        return token, float(log_softmax(logits)[token])
    logp = log_softmax(logits / params.temperature)
    keep = kept_mask(logp, params.top_k, params.top_p) & np.isfinite(logp)
    probs = np.where(keep, np.exp(logp), 0.0)
    cdf = np.cumsum(probs)
    # the first index whose cdf exceeds u has positive probability: cdf[i] > u >= cdf[i - 1]
    token = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return token, float(logp[token])
