"""Workloads: the runs a simulation admits, from a parametric model or from a trace of a real job.

A run is a sequence of turns; each turn prefills new context tokens, decodes output tokens, and waits for
tools. Its *nominal work* is its duration on an unloaded engine::

    work = tool_s + prefill_tokens / prefill_tok_s + decode_tokens / decode_tok_s

The engine part stretches with the load of the cell (``capacity.speed_factor``); tool time does not.
A run that never finishes (a stuck agent, or a trace run that hit the timeout) has infinite work and is
cut at the timeout. Tokens accrue uniformly over a run's work (``tok_per_work_s``). Context compression
splits a run into paths of ``path_turns`` turns; with J_max (``trajectory.j_max``, the same key the trajectory
processor reads) and its final-then-recent selection only the run's last J_max paths are trained, so the
trained tokens are the last ``train_window_s`` seconds of nominal work the run did (inf = the whole run).
Paths of equal length make the three selections (final_then_recent, final_then_longest, longest) pick the
same amount of work. A trace carries its own ``trained_tokens`` (measured under the live run's J_max);
``j_max`` does not change a trace.

Parametric model: turns = turns_median x exp(query_sigma * z_q + run_sigma * z_r), with a fraction
``stuck_query_frac`` of queries whose runs never finish; per-turn costs are the configured means.

Trace format (JSON Lines, one run per line; ``#`` lines and blank lines are ignored)::

    {"query": "repo-17", "prefill_tokens": 410000, "decode_tokens": 52000, "tool_s": 6100.5, "timed_out": false}
    {"query": "repo-17", "duration_s": 14000, "tokens": 690000, "trained_tokens": 350000, "timed_out": true}

Either the three cost fields or ``duration_s`` (taken as nominal work) with ``tokens``; the optional
``trained_tokens`` (default: all) are the tokens of the paths that enter training, taken from the run's end. Runs of one query
form a group, in order of first appearance; a simulation that needs more queries cycles through the trace.

Invariants
- The same config and seed give bit-identical workloads.
- Every run has work > 0 and tok_per_work_s >= 0; groups are contiguous (``offsets``).
- ``write_trace`` then ``read_trace`` reproduces work, tokens and groups (round trip).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gyre_hpc.config import SimConfig, WorkloadConfig
from gyre_hpc.errors import WorkloadError
from gyre_hpc.files.jsonl import read_objects


@dataclass(frozen=True)
class SimWorkload:
    """Runs grouped by query: run r of query q is ``offsets[q] <= r < offsets[q+1]``."""

    work_s: np.ndarray           # nominal work (s) per run; inf = never finishes
    tok_per_work_s: np.ndarray   # tokens per second of nominal work, per run
    train_window_s: np.ndarray   # nominal work at the end of a run whose tokens are trained (inf = all)
    offsets: np.ndarray          # group boundaries, len = queries + 1
    tool_frac: float             # fraction of nominal work spent in tools (not slowed by load)

    @property
    def queries(self) -> int:
        return len(self.offsets) - 1

    @property
    def max_group(self) -> int:
        return int(np.diff(self.offsets).max())

    def take(self, queries: int) -> "SimWorkload":
        """The first ``queries`` queries, cycling when the workload is shorter."""
        reps = -(-queries // self.queries)
        sizes = np.tile(np.diff(self.offsets), reps)[:queries]
        n = int(sizes.sum())
        return SimWorkload(np.tile(self.work_s, reps)[:n], np.tile(self.tok_per_work_s, reps)[:n],
                        np.tile(self.train_window_s, reps)[:n], np.concatenate([[0], np.cumsum(sizes)]),
                        self.tool_frac)


def _per_turn(cfg: WorkloadConfig, sim: SimConfig) -> tuple[float, float, float]:
    """(work seconds, tool seconds, tokens) of one turn."""
    engine = cfg.prefill_tokens_per_turn / sim.prefill_tok_s + cfg.decode_tokens_per_turn / sim.decode_tok_s
    return cfg.tool_s_per_turn + engine, cfg.tool_s_per_turn, cfg.prefill_tokens_per_turn + cfg.decode_tokens_per_turn


def parametric(cfg: WorkloadConfig, sim: SimConfig, queries: int, seed: int, j_max: int | None = None) -> SimWorkload:
    """``queries`` groups of ``cfg.runs_per_query`` runs drawn from the parametric model; ``j_max`` paths of
    ``cfg.path_turns`` turns are trained per run (None = all)."""
    rng = np.random.default_rng(seed)
    k = cfg.runs_per_query
    zq = rng.standard_normal(queries)
    zr = rng.standard_normal((queries, k))
    turns = cfg.turns_median * np.exp(cfg.query_sigma * zq[:, None] + cfg.run_sigma * zr)
    stuck = rng.random(queries) < cfg.stuck_query_frac
    turn_work, turn_tool, turn_tokens = _per_turn(cfg, sim)
    if turn_work <= 0:
        raise WorkloadError("workload: a turn costs no time (tool_s, prefill and decode tokens are all 0)")
    work = turns * turn_work
    work[stuck] = np.inf
    tok = np.full(work.size, turn_tokens / turn_work)
    window = np.inf
    if cfg.path_turns is not None and j_max is not None:
        window = cfg.path_turns * j_max * turn_work
    return SimWorkload(work.ravel(), tok, np.full(work.size, window), np.arange(queries + 1) * k,
                    turn_tool / turn_work)


def _run_fields(rec: dict, sim: SimConfig, where: str) -> tuple[float, float, float, float]:
    """(work, tokens, tool seconds, trained tokens) of one trace record; errors name ``where``."""
    def num(key: str) -> float:
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise WorkloadError(f"{where}: {key} must be a number >= 0, got {v!r}")
        return float(v)

    if "duration_s" in rec:
        work, tokens, tool = num("duration_s"), num("tokens"), 0.0
    elif all(k in rec for k in ("prefill_tokens", "decode_tokens", "tool_s")):
        tool = num("tool_s")
        work = tool + num("prefill_tokens") / sim.prefill_tok_s + num("decode_tokens") / sim.decode_tok_s
        tokens = num("prefill_tokens") + num("decode_tokens")
    else:
        raise WorkloadError(f"{where}: needs prefill_tokens, decode_tokens and tool_s, or duration_s and tokens")
    if work <= 0:
        raise WorkloadError(f"{where}: a run must take time (work is 0)")
    trained = num("trained_tokens") if "trained_tokens" in rec else np.inf
    return work, tokens, tool, trained


def read_trace(path: str | Path, sim: SimConfig) -> SimWorkload:
    """Parse a JSONL trace (format in the module docstring); errors name ``file:line``."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload.trace: file not found: {p}")
    groups: dict[str, list[tuple[float, float, bool, float]]] = {}
    tool_total = finite_total = 0.0
    for n, rec in read_objects(p, WorkloadError, comments=True, what="trace"):
        where = f"{p}:{n}"
        if not isinstance(rec.get("query"), (str, int)) or isinstance(rec.get("query"), bool):
            raise WorkloadError(f"{where}: expected an object with a string or integer 'query'")
        timed_out = rec.get("timed_out", False)
        if not isinstance(timed_out, bool):
            raise WorkloadError(f"{where}: timed_out must be true or false, got {timed_out!r}")
        work, tokens, tool, trained = _run_fields(rec, sim, where)
        if not timed_out:
            tool_total, finite_total = tool_total + tool, finite_total + work
        groups.setdefault(str(rec["query"]), []).append((work, tokens, timed_out, trained))
    if not groups:
        raise WorkloadError(f"{p}: the trace has no runs")
    runs = [r for g in groups.values() for r in g]
    work = np.array([np.inf if t else w for w, _, t, _ in runs])
    tok = np.array([k / w for w, k, _, _ in runs])
    window = np.array([tr / r if r > 0 else np.inf for (_, _, _, tr), r in zip(runs, tok)])
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in groups.values()])])
    return SimWorkload(work, tok, window, offsets, tool_total / finite_total if finite_total else 0.0)


def write_trace(path: str | Path, wl: SimWorkload, timeout_s: float) -> None:
    """Write ``wl`` as a trace (``duration_s`` form; infinite work is written as a timed-out run).

    The file is written to a temporary name and renamed, so a reader never sees half a trace.
    """
    p = Path(path)
    lines = []
    for q in range(wl.queries):
        for r in range(wl.offsets[q], wl.offsets[q + 1]):
            stuck = not np.isfinite(wl.work_s[r])
            work = timeout_s if stuck else float(wl.work_s[r])
            rec = {"query": q, "duration_s": work, "tokens": work * float(wl.tok_per_work_s[r]), "timed_out": stuck}
            if np.isfinite(wl.train_window_s[r]):
                rec["trained_tokens"] = float(wl.train_window_s[r] * wl.tok_per_work_s[r])
            lines.append(json.dumps(rec))
    fd, tmp = tempfile.mkstemp(dir=p.parent or ".", prefix=p.name + ".", suffix=".tmp")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, p)


def load(cfg: WorkloadConfig, sim: SimConfig, queries: int, seed: int, *, j_max: int | None) -> SimWorkload:
    """The workload of a simulation: ``queries`` groups from the trace (cycled) or the parametric model with
    ``j_max`` (``trajectory.j_max``) paths trained per run."""
    if cfg.trace is not None:
        return read_trace(cfg.trace, sim).take(queries)
    return parametric(cfg, sim, queries, seed, j_max)
