"""Sweeps (``gyre sweep``): a grid of config overrides, one job per element, results tabulated (pure core).

::

    --grid trajectory.j_max=1,3,null --grid scheduler.staleness_target=1,1.5
      parse_grid   -> (Axis("trajectory.j_max", ("1", "3", "null")), Axis("scheduler.staleness_target", ...))
      expand       -> 6 Elements, the last axis varying fastest: e0 j_max=1 target=1, e1 j_max=1 target=1.5, ...
      load_elements-> 6 frozen configs, each checked like a file (before anything is submitted)
      ... the edge (gyre_hpc.slurm.submit_sweep) runs them and collects one ElementOutcome per element ...
      result_rows  -> one row per element: element, axis values, status, metrics, error
      write_results-> results.csv and results.md

Invariants (tests/unit/test_sweep.py)
- A grid key is a leaf key of the config (``gyre config explain``); an unknown key or a section fails with the
  nearest valid keys, a repeated key or an empty value list fails too, all before any config is loaded.
- Values are split on commas outside brackets (``agent.turns=[1, 2],[1, 3]`` is two values) and stay text: the
  config loader types them, exactly as ``--set``.
- ``expand`` yields the full product in row-major order (the last axis varies fastest); element ``i`` is row
  ``i`` of the table.
- Every element is loaded (and checked by ``check``) before the first job is submitted; an error names the
  element, its grid values and the dotted key.
- Every element has exactly one row; a failed element keeps its row with ``status`` ``FAILED`` (or the
  scheduler's end state) and the tail of its error, never dropped.
- results.csv and results.md are written atomically; a cell of the markdown table never breaks the table
  (``|`` and newlines are escaped).
"""
from __future__ import annotations

import csv
import difflib
import io
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from gyre_hpc.config import explain, load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.files.io import atomic_write_text

COMPLETED = "COMPLETED"
#: columns every result row starts with (then the axes, then the metrics, then ``error``)
LEAD = ("element", "status")
#: metrics plotted for a training sweep (keys of the run's summary.json)
TRAIN_METRICS = ("wall_s", "reward_last", "staleness_mean")


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Element:
    index: int
    sets: tuple[tuple[str, str], ...]  # (dotted key, value text) per axis

    @property
    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.sets]

    @property
    def label(self) -> str:
        return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.sets)


@dataclass(frozen=True)
class ElementOutcome:
    """What the edge learned about one element: its end state, its result row (metrics) or error text."""

    status: str
    metrics: dict[str, Any]
    error: str = ""
    job_id: str = ""


def leaf_keys() -> list[str]:
    return [key for key, tp, _, _ in explain() if tp != "section"]


def split_values(text: str) -> list[str]:
    """``"1,[1, 2],null"`` -> ``["1", "[1, 2]", "null"]``: commas inside brackets or braces do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def check_key(key: str, option: str = "--grid") -> None:
    """Raise ``ConfigError`` unless ``key`` is a leaf config key; name the closest ones."""
    keys = leaf_keys()
    if key in keys:
        return
    sections = {k for k, tp, _, _ in explain() if tp == "section"}
    if key in sections:
        inside = [k for k in keys if k.startswith(key + ".")]
        raise ConfigError(f"{option} {key}: is a section, not a value; sweep one of its keys: {', '.join(inside)}")
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    section = key.split(".")[0]
    hints = [f"did you mean {' or '.join(near)}?"] if near else []
    hints.append(f"valid keys of {section}: {', '.join(k for k in keys if k.startswith(section + '.'))}"
                 if section in sections else f"sections: {', '.join(sorted(sections))}")
    hint = "; ".join(hints)
    raise ConfigError(f"{option} {key}: unknown config key; {hint} (gyre config explain lists every key)")


def parse_grid(specs: Sequence[str], option: str = "--grid") -> tuple[Axis, ...]:
    """``["a.b=1,2", "c.d=x"]`` -> axes; every key checked, nothing loaded."""
    axes: list[Axis] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{option} {spec!r}: expected key.path=v1,v2,... (e.g. trajectory.j_max=1,3,null)")
        check_key(key, option)
        items = split_values(values)
        if not values.strip() or any(not v for v in items):
            raise ConfigError(f"{option} {spec!r}: an empty value; give v1,v2,... (null for None)")
        if any(a.key == key for a in axes):
            raise ConfigError(f"{option} {key}: given twice; put all its values in one {option} {key}=v1,v2")
        axes.append(Axis(key, tuple(items)))
    if not axes:
        raise ConfigError(f"a sweep needs at least one {option} key=v1,v2,...")
    return tuple(axes)


def expand(axes: Sequence[Axis]) -> list[Element]:
    combos = itertools.product(*[a.values for a in axes])
    return [Element(i, tuple(zip([a.key for a in axes], combo))) for i, combo in enumerate(combos)]


def load_elements(path: str | Path | None, overrides: Sequence[str], elements: Sequence[Element],
                  check: Callable[[Any], None] | None = None) -> list[Any]:
    """The config of every element (base overrides first, then the element's); errors name the element."""
    if path is not None:
        load_config(path, overrides)  # a missing file or a bad --set is reported once, not per element
    cfgs = []
    for e in elements:
        try:
            cfg = load_config(path, list(overrides) + e.overrides)
            if check is not None:
                check(cfg)
        except ConfigError as exc:
            raise ConfigError(f"grid element {e.index} ({e.label}): {exc}") from None
        cfgs.append(cfg)
    return cfgs


def error_tail(text: str, lines: int = 3, width: int = 400) -> str:
    """The last non-empty lines of an error or log, joined with `` / `` (one table cell)."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " / ".join(kept)[-width:]


def result_rows(elements: Sequence[Element], outcomes: Sequence[ElementOutcome]) -> list[dict[str, Any]]:
    if len(elements) != len(outcomes):
        raise ValueError(f"{len(elements)} elements but {len(outcomes)} outcomes")
    rows = []
    for e, o in zip(elements, outcomes):
        row: dict[str, Any] = {"element": e.index, "status": o.status, **dict(e.sets), "job": o.job_id}
        row.update(o.metrics)
        row["error"] = error_tail(o.error, lines=2) if o.status != COMPLETED else ""
        rows.append(row)
    return rows


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return [c for c in cols if c != "error"] + (["error"] if "error" in cols else [])


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict[str, Any]], cols: Sequence[str] | None = None) -> str:
    cols = list(cols or columns(rows))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def counts(outcomes: Sequence[ElementOutcome]) -> dict[str, int]:
    done = sum(o.status == COMPLETED for o in outcomes)
    return {"completed": done, "failed": len(outcomes) - done}


def write_results(rows: Sequence[dict[str, Any]], out: Path, title: str) -> tuple[Path, Path]:
    """``results.csv`` and ``results.md`` (a title line, the table, the failures) under ``out``."""
    cols = columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, restval="")
    writer.writeheader()
    writer.writerows(rows)
    failed = [r for r in rows if r["status"] != COMPLETED]
    md = f"# {title}\n\n{len(rows) - len(failed)} of {len(rows)} elements completed.\n\n" + markdown_table(rows, cols)
    if failed:
        md += "\n## Failed elements\n\n" + "".join(f"- element {r['element']} ({r['status']}): {r['error']}\n"
                                                    for r in failed)
    return atomic_write_text(out / "results.csv", buf.getvalue()), atomic_write_text(out / "results.md", md)


def metric_columns(rows: Sequence[dict[str, Any]], simulate: bool) -> list[str]:
    """What the plot shows: simulated hours per policy, or the training metrics the rows carry."""
    cols = columns(rows)
    if simulate:
        return [c for c in cols if c.endswith("_hours")]
    return [c for c in TRAIN_METRICS if c in cols]
