"""The live engines' load during a run, and a run's nominal work: its measured duration with that load taken out.

A replayed live run (``sim/replay.py``) gives each run the duration it had under the live policy's load. When
the run's engines have a known load curve (the local engine's emulated device: a decode tick over n running
requests lasts ``device_tick_s x (1 + n / device_half_load)``, at most ``max_running_requests`` at once), the
replay converts each duration back to nominal work (the time on an unloaded engine) with the simulator's own
``capacity.speed_factor``, and the simulator stretches it again under the load of whichever policy it runs.
Without this, a what-if policy that crowds the runs onto fewer engines (async with one generating cell) ran
them as fast as the live policy's lightly loaded engines did.

The load a run sees at time t is the size-biased mean of the runs per cell, ``sum(n_c^2) / sum(n_c)`` over the
``runs`` records of ``events.jsonl`` (a run picked at random sits on cell c with probability n_c / sum(n_c)).
The proxy counts a run on a cell while it has a call there, so this is the engine's own load (requests), the
``n`` of ``capacity.engine_load``; the simulator, which places whole runs, derives it with ``sim.load_model:
calls`` (the replay sets it).
A run with TITO call records (``tito/q<gid>.jsonl``) gets its nominal work exactly: the time outside its calls
counts as it was (tool waits, the harness: not slowed by load), each call's time is divided by the engine stretch
of its moment. The tool fraction of those runs (tool seconds / nominal seconds) is the one the simulator blends
with (``Workload.tool_frac``); a run without call records is de-loaded through that blend::

    load L(t)      ___|‾‾‾‾‾|_____|‾‾|___     step function between runs records (0 while paused)
    with calls     W = (duration - call time) + sum over calls of integral of 1 / stretch(L(t)) dt
    without        W = integral of 1 / (tool_frac + (1 - tool_frac) stretch(L(t))) dt   (capacity.speed_factor)

Invariants (tests/unit/test_sim_engine_load.py)
- With no load (or an unbounded half_load) the nominal work equals the duration.
- Nominal work is monotone in t1 and never exceeds the duration (r <= 1).
- A run simulated at the load it was measured under takes its measured duration again (the inverse).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gyre_hpc.allocator.capacity import speed_factor


@dataclass(frozen=True)
class LoadSeries:
    """From wall time ``t[i]`` until ``t[i + 1]``: the size-biased runs-per-cell ``load[i]``, and ``paused[i]``
    when no cell is in the ROLLOUT role (colocate training: the runs wait and make no progress)."""

    t: np.ndarray
    load: np.ndarray
    paused: np.ndarray

    @classmethod
    def from_events(cls, events: list[dict]) -> "LoadSeries | None":
        """From the ``runs`` records (per-cell run counts) and the role changes (``start`` roles, switch orders
        out of rollout, ``switch_done`` into rollout); None when the log has no ``runs`` record."""
        if not any(e.get("event") == "runs" for e in events):
            return None
        rolling: set[int] = set()
        load, t, loads, paused = 0.0, [], [], []
        for e in events:
            kind = e.get("event")
            if kind == "start" and isinstance(e.get("roles"), list):
                rolling = {c for c, r in enumerate(e["roles"]) if r == "rollout"}
            elif kind == "order" and e.get("order") == "switch" and e.get("target") == "train":
                rolling.discard(e.get("cell"))
            elif kind == "switch_done" and e.get("role") == "rollout":
                rolling.add(e.get("cell"))
            elif kind == "runs" and isinstance(e.get("runs"), list):
                n = np.array(e["runs"], dtype=float)
                load = float((n ** 2).sum() / n.sum()) if n.sum() > 0 else 0.0
            else:
                continue
            t.append(float(e["wall"]))
            loads.append(load)
            paused.append(not rolling)
        return cls(np.array(t), np.array(loads), np.array(paused, dtype=bool))

    def integral(self, fn, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Integral of ``fn(load(t))`` (0 while paused) over [t0, t1] per element (load 0 before the first record)."""
        t = np.concatenate([[min(self.t[0], float(np.min(t0, initial=self.t[0]))) - 1.0], self.t])
        vals = np.array([fn(x) for x in np.concatenate([[0.0], self.load])])
        vals[1:][self.paused] = 0.0
        cum = np.concatenate([[0.0], np.cumsum(vals[:-1] * np.diff(t))])

        def at(x: np.ndarray) -> np.ndarray:
            i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
            return cum[i] + vals[i] * (x - t[i])

        return at(np.asarray(t1, float)) - at(np.asarray(t0, float))


@dataclass(frozen=True)
class Curve:
    """A live engine's load curve in the simulator's terms."""

    half_load: float
    slots: float
    tool_frac: float

    def rate(self, load: float) -> float:
        return speed_factor(load, self.half_load, self.tool_frac, self.slots)

    def nominal(self, series: LoadSeries, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Nominal work of runs that lived from ``t0`` to ``t1`` (wall seconds)."""
        return series.integral(self.rate, t0, t1)


def calls_by_run(tito_dir: Path) -> dict[tuple[int, int], np.ndarray]:
    """(t_start, t_end) rows of the model calls of run i of group g, keyed (g, i): the group's file is
    ``q<gid>.jsonl`` (``proxy.recorder.group_file``), the run's id ends in ``-r<i>``; empty if there is no TITO."""
    out: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for f in sorted(tito_dir.glob("q*.jsonl")) if tito_dir.is_dir() else []:
        if not f.stem[1:].isdigit():
            continue
        gid = int(f.stem[1:])
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn line: the replay reads timings, not tokens
            run, _, idx = str(rec.get("run_id", "")).rpartition("-r")
            if rec.get("type") == "call" and run and idx.isdigit() and isinstance(rec.get("t_start"), (int, float)) \
                    and isinstance(rec.get("t_end"), (int, float)):
                out.setdefault((gid, int(idx)), []).append((float(rec["t_start"]), float(rec["t_end"])))
    return {k: np.array(v, dtype=float) for k, v in out.items()}


def run_nominal(series: LoadSeries, half_load: float, slots: float, duration_s: float,
                calls: np.ndarray) -> tuple[float, float]:
    """(nominal work, tool seconds) of a run with its call intervals: the time outside calls counts as it was
    (tool waits, the harness), each call's time is divided by the engine stretch of its moment."""
    engine = Curve(half_load, slots, 0.0)
    tool = max(duration_s - float(np.sum(calls[:, 1] - calls[:, 0])), 0.0)
    return tool + float(np.sum(engine.nominal(series, calls[:, 0], calls[:, 1]))), tool
