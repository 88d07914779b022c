"""What a tracked run logs, and what a backend still has to receive (pure: stdlib only).

::

    metrics.jsonl record ─ step_metrics ─▶ {"reward/mean": .., "staleness/max": .., ...}   (METRICS: the stable names)
    events since the last step ─ EventWindow ─▶ switch latencies by phase, groups lost
    rank 0's role counts over time ─ RoleShares ─▶ each role's share of cell time in the step
    resume: kept steps + what each backend had taken (Ledger) ─ reconcile ─▶ (purge_from, records to send)

Invariants (tests/unit/test_tracking_plan.py)
- A metric name is one of ``METRICS`` (or ``role_share/<role>``, ``switch_s/<phase>``, ``summary/<key>``); a value
  that is None or not a finite number is left out, never sent as 0.
- Steps are numbered by the record's ``step`` (the optimizer step, 1-based); a backend receives each step at most
  once per ledger: ``Ledger.take`` refuses a step at or below what it already holds.
- After a relaunch the kept steps win: ``reconcile`` resends the kept steps a backend had not yet taken and, when a
  backend took steps beyond the kept ones (rank 0 died after its last save), says from which step they must be
  purged (TensorBoard's purge_step); backends that cannot purge are only fed steps a resume state covers
  (``Ledger.hold``), so they never hold a step that is trained again.
- ``flat_params`` turns the resolved config into ``section.key`` → scalar (lists as text), deterministic order.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: stable metric names (docs/runtime.md, "Experiment tracking"): name -> (metrics.jsonl key, meaning)
METRICS: dict[str, tuple[str, str]] = {
    "reward/mean": ("reward", "mean reward of the step's scored runs"),
    "reward/std": ("reward_std", "spread (population std) of those rewards"),
    "staleness/mean": ("staleness_mean", "policy lag d of the trained tokens, token-weighted mean"),
    "staleness/max": ("staleness_max", "largest d in the step"),
    "staleness/prequeue_mean": ("staleness_prequeue_mean", "lag gathered before the group was ready"),
    "staleness/prequeue_max": ("staleness_prequeue_max", "its maximum"),
    "staleness/inqueue_mean": ("staleness_inqueue_mean", "lag gathered while the group waited in the buffer"),
    "staleness/inqueue_max": ("staleness_inqueue_max", "its maximum"),
    "tokens/trained": ("trained_tokens", "tokens the step trained (tree-packed: each shared token once)"),
    "tokens/flat": ("flat_tokens", "the same paths packed flat (when the record has it)"),
    "tokens/tree": ("tree_tokens", "tree-packed tokens (when the record has it)"),
    "time/optimizer_s": ("optimizer_s", "the core's optimizer step time"),
    "time/step_s": ("step_s", "wall time since the previous step (rank 0's clock)"),
    "train/loss": ("loss", "policy loss"),
    "train/grad_norm": ("grad_norm", "gradient norm"),
    "agreement/logprob_abs_diff_mean": ("logprob_abs_diff_mean", "train-inference logprob |diff|, mean"),
    "agreement/logprob_abs_diff_max": ("logprob_abs_diff_max", "its maximum"),
    "runs/scored": ("scored_runs", "runs scored in the step"),
    "runs/total": ("runs", "runs in the step's groups"),
    "groups/trained": ("groups", "groups the step trained"),
    "groups/lost": ("groups_lost", "groups lost since the previous step (event group_lost)"),
    "cells/training": ("n_cells", "cells that trained the step"),
}
#: phases of a switch_done event's timing, logged as switch_s/<phase> (mean over the step's switches)
SWITCH_PHASES = ("total", "drain", "engine_stop", "engine_sleep", "trainer_init", "weight_pull", "engine_start",
                 "engine_wake")
#: summary.json keys logged at the end as summary/<key> (numbers only; nested dicts flattened with "/")
LOST_EVENTS = ("group_lost", "groups_lost")


def number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def step_metrics(rec: Mapping[str, Any]) -> dict[str, float]:
    """The stable metrics of one metrics.jsonl record (plus the derived keys the sink adds)."""
    out = {}
    for name, (key, _) in METRICS.items():
        if (v := number(rec.get(key))) is not None:
            out[name] = v
    return out


def flat_numbers(d: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Numbers of a nested dict as ``prefix/a/b``; everything else is left out."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flat_numbers(v, f"{prefix}/{k}"))
        elif (x := number(v)) is not None:
            out[f"{prefix}/{k}"] = x
    return out


def flat_params(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The resolved config as hyperparameters: ``section.key`` -> bool/int/float/str (lists and None as text)."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat_params(v, key + "."))
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = str(v)
    return out


class EventWindow:
    """Events between two steps: switch latencies by phase (means) and groups lost (count)."""

    def __init__(self) -> None:
        self.switches: list[dict] = []
        self.lost = 0

    def add(self, ev: Mapping[str, Any]) -> None:
        if ev.get("event") == "switch_done":
            self.switches.append({**ev.get("timing", {}), "total_s": ev.get("total_s")})
        elif ev.get("event") in LOST_EVENTS:
            self.lost += len(ev["gids"]) if isinstance(ev.get("gids"), list) else 1

    def take(self) -> dict[str, float]:
        out: dict[str, float] = {"groups/lost": float(self.lost)}
        for phase in SWITCH_PHASES:
            xs = [x for s in self.switches if (x := number(s.get(f"{phase}_s"))) is not None]
            if xs:
                out[f"switch_s/{phase}"] = sum(xs) / len(xs)
        self.switches, self.lost = [], 0
        return out


class RoleShares:
    """Each role's share of cell time between two steps, from samples of the role counts (piecewise constant)."""

    def __init__(self) -> None:
        self.last: tuple[float, dict[str, int]] | None = None
        self.acc: dict[str, float] = {}

    def observe(self, now: float, counts: Mapping[str, int]) -> None:
        if self.last is not None:
            t, c = self.last
            for role, n in c.items():
                self.acc[role] = self.acc.get(role, 0.0) + n * max(0.0, now - t)
        self.last = (now, dict(counts))

    def take(self, now: float) -> dict[str, float]:
        if self.last is not None:
            self.observe(now, self.last[1])
        total = sum(self.acc.values())
        out = {f"role_share/{r}": v / total for r, v in sorted(self.acc.items())} if total > 0 else {}
        self.acc = {}
        return out


@dataclass
class Ledger:
    """What one backend has taken: the last step (``upto``); ``hold``: the last step it may take (None: any)."""

    upto: int = 0
    hold: int | None = None
    pending: deque = field(default_factory=deque)

    def take(self, step: int) -> bool:
        """May this step go to the backend now (in order, once)?"""
        return step > self.upto and (self.hold is None or step <= self.hold)


def reconcile(kept: Iterable[Mapping[str, Any]], taken_upto: int) -> tuple[int | None, list[Mapping[str, Any]]]:
    """After a resume/relaunch: (purge_from, records to send). ``kept``: the step records the resume state holds;
    ``taken_upto``: the last step the backend took in earlier segments. Steps beyond the last kept one will be
    trained again: a backend that took them purges from the first of them."""
    kept = list(kept)
    last = max((int(r["step"]) for r in kept), default=0)
    purge = last + 1 if taken_upto > last else None
    return purge, [r for r in kept if int(r["step"]) > taken_upto]
