"""Grids of simulations: ``--sweep key=a,b,c`` (repeatable) runs every combination and tabulates it.

Invariants
- Each grid point is a full config load (the same strict checks as the file), so a bad value fails with
  its dotted key before any simulation of that point runs.
- The CSV and the markdown table are written to temporary names and renamed (atomic).
"""
from __future__ import annotations

import csv
import io
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from gyre_hpc.config import load_config
from gyre_hpc.sweep import markdown_table, parse_grid


def parse_axes(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``["a.b=1,2"]`` → ``[("a.b", ["1", "2"])]``; values stay text (the loader types them).
    The parsing and key checks are ``gyre sweep``'s (gyre_hpc.sweep.parse_grid)."""
    return [(a.key, list(a.values)) for a in parse_grid(specs, option="--sweep")]


def run_grid(path: str | None, overrides: list[str], axes: list[tuple[str, list[str]]],
             compare: Callable[[Any], tuple[dict, dict]], validate: Callable[[Any], None]) -> list[dict[str, Any]]:
    """One row per grid point: the axis values, then hours, speedups and staleness per policy."""
    cfgs = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        sets = [f"{k}={v}" for (k, _), v in zip(axes, combo)]
        cfgs.append((combo, load_config(path, overrides + sets)))
        validate(cfgs[-1][1])  # every point is checked before any simulation runs
    rows = []
    for combo, cfg in cfgs:
        result, _ = compare(cfg)
        rows.append({**{k: v for (k, _), v in zip(axes, combo)}, **sim_row(result)})
    return rows


def sim_row(result: dict[str, Any]) -> dict[str, Any]:
    """The table columns of one ``compare`` result: hours and staleness per policy, gyre's speedups, workload."""
    row: dict[str, Any] = {}
    for name, r in result["policies"].items():
        row[f"{name}_hours"] = round(r["hours"], 3)
        row[f"{name}_staleness"] = round(r["staleness_mean"], 3)
    for key, v in result["speedups"].items():
        if key.startswith("gyre_vs_"):
            row[key] = round(v, 3)
    row["frac_queries_ge_4h"] = round(result["workload"]["frac_queries_ge_4h"], 3)
    row["frac_queries_hit_timeout"] = round(result["workload"]["frac_queries_hit_timeout"], 3)
    row["trained_tokens_per_run"] = round(result["workload"]["trained_tokens_per_run_mean"])  # moves with j_max
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, list(rows[0]))


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_tables(rows: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """Write ``sweep.csv`` and ``sweep.md`` under ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    cols = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=cols)
    writer.writeheader()
    writer.writerows(rows)
    csv_path, md_path = out / "sweep.csv", out / "sweep.md"
    _atomic_write(csv_path, buf.getvalue())
    _atomic_write(md_path, markdown(rows))
    return csv_path, md_path
