"""The trajectory pipeline: TITO log → scores and advantages → per-run prefix trees → J_max selection → packing.

::

    read_tito ─► scoring (which runs train) ─► advantages (per query group) ─► build_tree (per trained run)
              ─► select_paths (J_max) ─► pack_tree | pack_flat ─► PackedBatch + BatchReport

Counting (``BatchReport``; the keys of ``gyre trajectory stats --json``):

- ``runs``, ``calls``: everything in the log.
- ``paths``, ``paths_dropped``, ``flat_tokens``, ``tree_tokens``, ``trained_tokens``: over the runs that train
  (scored or timeout_partial, in a group that is not dropped). ``paths`` are the kept leaves, ``paths_dropped``
  the leaves the J_max cap removed; ``flat_tokens`` is the sum of the kept path lengths (every path its own
  sample), ``tree_tokens`` the nodes of the kept subtrees (shared prefixes once), ``trained_tokens`` the generated
  nodes among them (each trained once).
- ``eval_failures``, ``timeout_partial``: runs with that status in the log.

Invariants
- ``build_batch`` in either mode trains exactly ``report.trained_tokens`` tokens (``loss_mask.sum()``), and the
  same (run, node) pairs with the same advantages, so flat and tree mode give the same loss.
- Tree mode computes ``report.tree_tokens`` tokens and flat mode ``report.flat_tokens``.
"""
from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gyre_hpc.config import TrajectoryConfig
from gyre_hpc.errors import TrajectoryError
from gyre_hpc.trajectory.advantages import group_advantages
from gyre_hpc.files.io import atomic_write_many
from gyre_hpc.trajectory.batch import FIELDS, PackedBatch
from gyre_hpc.trajectory.branches import classify
from gyre_hpc.trajectory.packing import RunItem, pack_flat, pack_tree
from gyre_hpc.trajectory.records import RunStatus, TitoLog
from gyre_hpc.trajectory.scoring import exclusion_reason, training_score
from gyre_hpc.trajectory.select import select_paths
from gyre_hpc.trajectory.tree import build_tree

STATS_KEYS = ("runs", "calls", "paths", "paths_dropped", "flat_tokens", "tree_tokens", "trained_tokens",
              "eval_failures", "timeout_partial")


@dataclass(frozen=True)
class RunReport:
    run_id: str
    query_id: str
    status: str
    score: float | None
    advantage: float | None  # None when the run does not train
    trained: bool
    reason: str  # "trained", the excluding status, or "equal_scores" (group dropped)
    calls: int
    leaves: int = 0
    selected: tuple[str, ...] = ()  # call ids of the kept leaves, priority order
    dropped: tuple[str, ...] = ()  # call ids of the leaves J_max dropped
    flat_tokens: int = 0
    tree_tokens: int = 0
    trained_tokens: int = 0
    branches: dict[str, int] = field(default_factory=dict)  # BranchKind value → calls


@dataclass(frozen=True)
class BatchReport:
    runs: int
    calls: int
    paths: int
    paths_dropped: int
    flat_tokens: int
    tree_tokens: int
    trained_tokens: int
    eval_failures: int
    timeout_partial: int
    timeout_unscorable: int
    aborted: int
    runs_trained: int
    groups: int
    groups_dropped: int
    branches: dict[str, int]
    per_run: tuple[RunReport, ...]

    def stats(self) -> dict[str, int]:
        """Exactly the keys of ``gyre trajectory stats --json``."""
        return {k: getattr(self, k) for k in STATS_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Plan:
    items: tuple[RunItem, ...]
    report: BatchReport


def _trained_run(log: TitoLog, run_id: str, adv: float, cfg: TrajectoryConfig) -> tuple[RunItem, RunReport]:
    calls, out = log.runs[run_id], log.outcome[run_id]
    base = dict(run_id=run_id, query_id=out.query_id, status=out.status.value, score=out.score, advantage=adv,
                trained=True, reason="trained", calls=len(calls))
    if not calls:
        return RunItem(run_id, None, (), adv), RunReport(**base)
    tree = build_tree(calls)
    kept, dropped = select_paths(tree, cfg.j_max, cfg.selection)
    keep = tree.keep_mask(kept)
    ids = tuple(c.call_id for c in calls)
    report = RunReport(**base, leaves=tree.n_leaves, selected=tuple(ids[tree.leaf_call[i]] for i in kept),
                       dropped=tuple(ids[tree.leaf_call[i]] for i in dropped),
                       flat_tokens=int(tree.leaf_len[kept].sum()), tree_tokens=int(keep.sum()),
                       trained_tokens=int((tree.nodes.generated & keep).sum()),
                       branches=dict(Counter(b.kind.value for b in classify(tree, calls))))
    return RunItem(run_id, tree, tuple(kept), adv, ids), report


def plan(log: TitoLog, cfg: TrajectoryConfig) -> Plan:
    """Everything but the packing: which runs and paths train, their advantages, and the report."""
    missing = [r for r in log.runs if r not in log.outcome]
    if missing:
        raise TrajectoryError(f"{log.source}: run {missing[0]} has no outcome ({len(missing)} unfinished run(s))")
    scores = {r: (o.query_id, training_score(o)) for r, o in log.outcome.items()}
    advantages, dropped_groups = group_advantages(scores, cfg.advantage_norm, cfg.advantage_eps,
                                                  cfg.equal_score_groups)
    items, reports = [], []
    for run_id, out in log.outcome.items():
        if run_id in advantages:
            item, rep = _trained_run(log, run_id, advantages[run_id], cfg)
            items += [item] if item.leaves else []
        else:
            rep = RunReport(run_id, out.query_id, out.status.value, out.score, None, False,
                            exclusion_reason(out) or "equal_scores", len(log.runs[run_id]))
        reports.append(rep)
    status = Counter(o.status for o in log.outcomes)
    trained = [r for r in reports if r.trained]
    report = BatchReport(
        runs=len(log.outcomes), calls=len(log.calls), paths=sum(len(r.selected) for r in trained),
        paths_dropped=sum(len(r.dropped) for r in trained), flat_tokens=sum(r.flat_tokens for r in trained),
        tree_tokens=sum(r.tree_tokens for r in trained), trained_tokens=sum(r.trained_tokens for r in trained),
        eval_failures=status[RunStatus.EVAL_FAILURE], timeout_partial=status[RunStatus.TIMEOUT_PARTIAL],
        timeout_unscorable=status[RunStatus.TIMEOUT_UNSCORABLE], aborted=status[RunStatus.ABORTED],
        runs_trained=len(trained), groups=len({q for q, s in scores.values() if s is not None}),
        groups_dropped=len(dropped_groups), branches=dict(sum((Counter(r.branches) for r in trained), Counter())),
        per_run=tuple(reports))
    return Plan(tuple(items), report)


def build_batch(log: TitoLog, cfg: TrajectoryConfig,
                mode: Literal["flat", "tree"] | None = None) -> tuple[PackedBatch, BatchReport]:
    """Pack the trained paths of ``log`` (``mode`` defaults to ``cfg.pack_mode``)."""
    mode = mode or cfg.pack_mode
    if mode not in ("flat", "tree"):
        raise TrajectoryError(f"pack mode must be 'flat' or 'tree', got {mode!r}")
    p = plan(log, cfg)
    pack = pack_tree if mode == "tree" else pack_flat
    return pack(p.items, cfg.max_row_tokens), p.report


def save_packed(out_dir: str | Path, batch: PackedBatch, report: BatchReport) -> Path:
    """Write ``batch.npz`` (the PackedBatch arrays) and ``report.json`` into ``out_dir``: both are written to
    temporary siblings before either is renamed into place, so a failure leaves neither half-written."""
    out = Path(out_dir)
    buf = io.BytesIO()
    np.savez(buf, lengths=batch.lengths, **{k: getattr(batch, k) for k in FIELDS})
    atomic_write_many({out / "batch.npz": buf.getvalue(),
                       out / "report.json": (json.dumps(report.to_dict(), indent=1) + "\n").encode()})
    return out


def load_packed(out_dir: str | Path) -> PackedBatch:
    """Read back ``out_dir/batch.npz`` (validated)."""
    path = Path(out_dir) / "batch.npz"
    try:
        with np.load(path) as z:
            return PackedBatch(lengths=z["lengths"], **{k: z[k] for k in FIELDS}).validate()
    except (OSError, KeyError, ValueError) as exc:
        raise TrajectoryError(f"{path}: not a packed batch ({exc})") from None
