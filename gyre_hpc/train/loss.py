"""Per-token policy-gradient losses over packed tree/flat rows.

A token at row position ``i`` is predicted from the model output at ``parent[i]`` (the ``PackedBatch`` contract),
so logprobs are gathered as ``log_softmax(logits[r, parent[r, i]])[input_ids[r, i]]`` for each trained position;
a position with two children predicts both. Only trained positions reach ``log_softmax``.

Losses, summed over trained tokens ``t`` with weight ``m_t`` (``loss_mask``) and normalised by ``Z``, the trained
tokens of the whole step (the same in flat and tree mode)::

    pg:   L = -Σ m_t · A_t · logp_t / Z
    ppo:  L = -Σ m_t · min(ρ_t A_t, clip(ρ_t, 1-ε, 1+ε) A_t) / Z,   ρ_t = exp(logp_t - old_logprob_t)

Truncated importance sampling (``train.tis_cap`` = C, off when null) multiplies each token's policy-gradient
term by a constant (no gradient flows through it) weight::

    w_t = min(exp(trainer_old_t - engine_t), C)

``engine_t`` is the engine's logprob of the token (``PackedBatch.old_logprob``), ``trainer_old_t`` the trainer's
logprob before the step's first update. With TIS on, the ppo ratio is taken against ``trainer_old_t`` (the
trainer's own old policy) and ``w_t`` corrects for the engine that sampled the token:
``L = -Σ m_t · w_t · min(ρ_t A_t, clip(ρ_t) A_t) / Z``, ``ρ_t = exp(logp_t - trainer_old_t)``.

``chunked_logprobs`` computes the same from the final hidden states, running the output layer over
``train.logits_chunk_tokens`` trained tokens at a time (recomputed in the backward): the same logprobs and
gradients, without ever holding a micro-batch's full float32 logits.

Invariants
- ``chunked_logprobs`` equals ``gather_logprobs`` over the full logits (values and gradients, up to float
  rounding), for any chunk size.
- The loss depends only on the set of (token, predicting context, weight, advantage) tuples, not on how rows
  are packed: flat and tree packings of the same paths give the same loss and gradients.
- With ``old_logprob`` equal to the current logprob (on-policy), ppo has the same gradient as pg.
- TIS weights lie in [0, C]; a token's gradient is scaled by exactly its weight; with every weight 1 (trainer and
  engine agree) the loss and gradients are those without TIS.
"""
from __future__ import annotations

import torch


def gather_logprobs(
    logits: torch.Tensor, parent: torch.Tensor, targets: torch.Tensor, select: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``(logp [N], entropy [N], (rows, cols))`` of the ``N`` positions where ``select`` is true."""
    rows, cols = torch.nonzero(select, as_tuple=True)
    src = parent[rows, cols]
    logsm = torch.log_softmax(logits[rows, src].float(), dim=-1)  # [N, V]
    logp = logsm.gather(1, targets[rows, cols].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy, (rows, cols)


def _chunk_logprobs(hidden, targets, head):
    logsm = torch.log_softmax(head(hidden).float(), dim=-1)
    logp = logsm.gather(1, targets.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def chunked_logprobs(
    hidden: torch.Tensor, head, parent: torch.Tensor, targets: torch.Tensor, select: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``gather_logprobs`` from the final hidden states ``[s, b, h]`` and the output layer ``head`` (``[n, h]`` →
    ``[n, V]`` logits), ``chunk`` trained tokens at a time: each chunk's logits exist only inside it (the backward
    recomputes them, ``torch.utils.checkpoint``), so at most ``[chunk, V]`` float32 logits are held at once."""
    from torch.utils.checkpoint import checkpoint

    rows, cols = torch.nonzero(select, as_tuple=True)
    h = hidden[parent[rows, cols], rows]  # [N, h]: the predicting position's output
    tgt = targets[rows, cols]
    parts = [checkpoint(_chunk_logprobs, h[a:a + chunk], tgt[a:a + chunk], head, use_reentrant=False)
             for a in range(0, len(tgt), chunk)]
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, (rows, cols)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]).detach(), (rows, cols)


def policy_loss(
    logp: torch.Tensor,
    advantage: torch.Tensor,
    weight: torch.Tensor,
    normalizer: float,
    kind: str = "pg",
    old_logprob: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    tis: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scalar loss of the given tokens (see the module docstring); ``tis``: per-token TIS weights or None."""
    if kind == "pg":
        per_token = -advantage * logp
    elif kind == "ppo":
        if old_logprob is None:
            raise ValueError("ppo loss needs old_logprob")
        ratio = torch.exp(logp - old_logprob)
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        per_token = -torch.minimum(ratio * advantage, clipped * advantage)
    else:
        raise ValueError(f"unknown loss kind {kind!r}; expected 'pg' or 'ppo'")
    if tis is not None:
        per_token = per_token * tis.detach()
    return (per_token * weight).sum() / normalizer


@torch.no_grad()
def tis_weights(trainer_old: torch.Tensor, engine: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(exp(trainer_old - engine), cap)`` per token (see the module docstring)."""
    return torch.clamp(torch.exp(trainer_old.float() - engine.float()), max=cap)


@torch.no_grad()
def ppo_stats(logp: torch.Tensor, old_logprob: torch.Tensor, weight: torch.Tensor, clip_eps: float) -> dict:
    """``clip_frac`` (weighted share of tokens with the ratio outside [1-ε, 1+ε]) and ``approx_kl`` (mean of
    ``old_logprob - logp``)."""
    w = weight.sum().clamp_min(1e-12)
    outside = (torch.exp(logp - old_logprob) - 1.0).abs() > clip_eps
    return {
        "clip_frac": float((outside.float() * weight).sum() / w),
        "approx_kl": float(((old_logprob - logp) * weight).sum() / w),
    }
