"""The one metrics sink of a run (edge, rank 0 only): one worker thread per backend, never blocking the caller.

::

    rank 0's loop ── Tracker.step(rec) ──▶ plan.step_metrics + role shares + event window ──▶ each backend's queue
                     Tracker.kept(n)     ──▶ backends that cannot purge may now take steps <= n
                     Tracker.finish(summary, pngs) ──▶ images + summary; close() waits close_timeout_s at most
    worker (per backend): open (run id from RUN_DIR/tracking/<backend>.json) → deliver the queue head in order →
                     persist {"run_id", "upto"} after each step it took

Invariants (tests/integration/test_tracking_*.py)
- The caller never waits on a backend: ``step``/``kept``/``images``/``finish`` only append to bounded queues.
- Never fatal: a failing call is retried with back-off (``retry_s`` doubling to 60 s) until it succeeds or the sink
  closes; each failure is one ``tracking_error`` record in ``errors`` (rank 0 writes them to events.jsonl) and one
  warning on stderr per backend and failure streak. A queue over ``buffer_steps`` drops its oldest step (counted).
- Each step reaches a backend at most once per run directory (``upto`` persisted after every step it took), in
  step order; a resumed/relaunched run continues the same run id and directory (plan.reconcile decides what to
  resend and, for TensorBoard, from which step to purge).
"""
from __future__ import annotations

import json
import sys
import threading
from gyre_hpc.clock import WallClock
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Mapping

from gyre_hpc.config import TrackingConfig
from gyre_hpc.files.io import atomic_write_json
from gyre_hpc.tracking import backends as B
from gyre_hpc.tracking import plan

_CLOCK = WallClock()  # wall stamps and deadlines through the one clock (gyre_hpc/clock.py)

MAX_BACKOFF_S = 60.0


def state_path(state_dir: Path, kind: str) -> Path:
    return Path(state_dir) / f"{kind}.json"


def read_state(state_dir: Path, kind: str) -> dict:
    p = state_path(state_dir, kind)
    try:
        return json.loads(p.read_text()) if p.is_file() else {}
    except (OSError, ValueError):
        return {}


class _Worker(threading.Thread):
    def __init__(self, backend, state_dir: Path, state: dict, buffer: int, retry_s: float, hold: int | None,
                 errors: list, lock: threading.Lock) -> None:
        super().__init__(name=f"tracking-{backend.name}", daemon=True)
        self.b, self.state_dir, self.state = backend, Path(state_dir), dict(state)
        self.q: deque = deque()
        self.buffer, self.retry_s, self.hold = buffer, retry_s, hold
        self.cv = threading.Condition()
        self.closing = False
        self.finished = False
        self.errors, self.elock = errors, lock
        self.opened = False
        self.dropped = 0
        self.deadline: float | None = None

    # --- caller side (rank 0's loop): append only
    def put(self, item: tuple) -> None:
        with self.cv:
            if item[0] == "metrics" and sum(i[0] == "metrics" for i in self.q) >= self.buffer:
                old = next(i for i in self.q if i[0] == "metrics")
                self.q.remove(old)
                self.dropped += 1
                self._error(f"buffer full ({self.buffer} steps): dropped step {old[1]}", dropped_step=old[1])
            self.q.append(item)
            self.cv.notify()

    def set_hold(self, hold: int | None) -> None:
        with self.cv:
            self.hold = hold
            self.cv.notify()

    def close(self, finished: bool) -> None:
        with self.cv:
            self.closing, self.finished = True, finished
            self.cv.notify()

    # --- worker side
    def _ready(self) -> bool:
        if not self.q:
            return False
        head = self.q[0]
        return head[0] != "metrics" or self.hold is None or head[1] <= self.hold

    def run(self) -> None:
        backoff = self.retry_s
        failing = False
        while True:
            with self.cv:
                while not self._ready() and not self.closing:
                    self.cv.wait(1.0)
                if not self._ready():
                    break  # closing, nothing more it may take
                item = self.q[0]
            try:
                if not self.opened:
                    self.state.update(self.b.open(self.state))
                    self.opened = True
                    self._persist()
                self._deliver(item)
            except Exception as exc:  # noqa: BLE001  (any backend failure: never fatal, retried)
                self._error(f"{type(exc).__name__}: {exc}".splitlines()[0][:300], warn=not failing)
                failing = True
                with self.cv:
                    if self.closing and self._gave_up():
                        break
                    wait = backoff if not self.closing else min(backoff, max(0.0, self.deadline - _CLOCK.now()))
                    self.cv.wait(wait)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            failing, backoff = False, self.retry_s
            with self.cv:
                if self.q and self.q[0] is item:
                    self.q.popleft()
            if item[0] == "metrics":
                self.state["upto"] = item[1]
                self._persist()
            elif item[0] == "params":
                self.state["params"] = True
                self._persist()
        try:
            if self.opened:
                self.b.close(self.finished)
        except Exception as exc:  # noqa: BLE001
            self._error(f"close: {type(exc).__name__}: {exc}"[:300])

    def _gave_up(self) -> bool:
        return self.deadline is not None and _CLOCK.now() >= self.deadline

    def _deliver(self, item: tuple) -> None:
        kind = item[0]
        if kind == "params":
            if not self.state.get("params"):
                self.b.params(item[1])
        elif kind == "metrics":
            if item[1] > self.state.get("upto", 0):  # once per step
                self.b.metrics(item[1], item[2])
        elif kind == "scalars":
            self.b.metrics(item[1], item[2])
        elif kind == "image":
            self.b.image(item[1], item[2], item[3])
        elif kind == "summary":
            self.b.summary(item[1])
            if item[3] and self.b.name != "wandb":  # W&B: the numbers are its run summary already
                self.b.metrics(item[2], item[3])

    def _persist(self) -> None:
        try:
            atomic_write_json(state_path(self.state_dir, self.b.name), self.state)
        except OSError as exc:
            self._error(f"cannot persist {state_path(self.state_dir, self.b.name)}: {exc}")

    def _error(self, msg: str, warn: bool = True, **extra: Any) -> None:
        rec = {"event": "tracking_error", "backend": self.b.name, "error": msg, **extra}
        with self.elock:
            self.errors.append(rec)
        if warn:
            print(f"gyre tracking: warning: {self.b.name}: {msg} (retrying; training goes on)", file=sys.stderr,
                  flush=True)


class Tracker:
    """Rank 0's sink. ``kept``: the step records a resume state holds (None for a new run); ``hold_steps``: True
    when rank 0 saves its resume state periodically (then backends that cannot purge take a step once it is saved)."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path, *, params: Mapping[str, Any], name: str,
                 kept: list[dict] | None = None,
                 hold_steps: bool = False, group: str | None = None, tags: Mapping[str, Any] | None = None,
                 parent: str | None = None, tb_dir: Path | None = None, state_dir: Path | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.state_dir = Path(state_dir) if state_dir is not None else self.run_dir / "tracking"
        self.errors: list[dict] = []
        self.elock = threading.Lock()
        self.window, self.roles = plan.EventWindow(), plan.RoleShares()
        self.last_step_t: float | None = None
        self.renderer: threading.Thread | None = None
        self.workers: list[_Worker] = []
        last_kept = max((int(r["step"]) for r in kept or []), default=0)
        for kind in cfg.backends:
            state = read_state(self.state_dir, kind)
            purge, resend = plan.reconcile(kept or [], state.get("upto", 0)) if kept is not None else (None, [])
            if purge is not None and kind != "tensorboard":  # cannot purge: keep the earlier segment's values
                state["upto"] = min(state.get("upto", 0), last_kept)
            backend = B.make(kind, self.run_dir, project=cfg.project, name=name, mlflow_uri=cfg.mlflow_uri,
                             group=group, tags=dict(tags or {}), parent=parent, tb_dir=tb_dir, purge_from=purge)
            if purge is not None and kind == "tensorboard":
                state["upto"] = min(state.get("upto", 0), purge - 1)
            hold = last_kept if hold_steps and not backend.purges else None
            w = _Worker(backend, self.state_dir, state, cfg.buffer_steps, cfg.retry_s, hold, self.errors, self.elock)
            w.put(("params", dict(params)))
            for rec in resend:
                w.put(("metrics", int(rec["step"]), plan.step_metrics(rec)))
            w.start()
            self.workers.append(w)

    # ------------------------------------------------------------------ called by rank 0's loop (never blocks)
    def observe_roles(self, now: float, counts: Mapping[str, int]) -> None:
        self.roles.observe(now, counts)

    def event(self, ev: Mapping[str, Any]) -> None:
        self.window.add(ev)

    def step(self, rec: Mapping[str, Any], now: float) -> None:
        rec = dict(rec)
        if self.last_step_t is not None:
            rec.setdefault("step_s", now - self.last_step_t)
        self.last_step_t = now
        rec.setdefault("n_cells", len(rec.get("cells", [])))
        rec.setdefault("groups_lost", self.window.lost)
        m = {**plan.step_metrics(rec), **self.window.take(), **self.roles.take(now)}
        for w in self.workers:
            w.put(("metrics", int(rec["step"]), m))

    def kept(self, upto: int | None) -> None:
        """Steps up to ``upto`` are in a resume state (None: every step is kept, e.g. at the end)."""
        for w in self.workers:
            if w.hold is not None:
                w.set_hold(upto)

    def images(self, paths: Iterable[Path], step: int) -> None:
        for p in paths:
            if Path(p).is_file():
                for w in self.workers:
                    w.put(("image", Path(p).stem, Path(p), step))

    def finish(self, summary: Mapping[str, Any], step: int, pngs: Iterable[Path] = ()) -> None:
        """The end of the run: every step is kept; the PNGs and the summary (as text/artifact and its numbers as
        ``summary/...`` scalars at the last step) follow the steps."""
        self.kept(None)
        self.images(pngs, step)
        nums = plan.flat_numbers(summary, "summary")
        for w in self.workers:
            w.put(("summary", dict(summary), step, nums))

    def scalars(self, step: int, nums: Mapping[str, float], pngs: Iterable[Path] = ()) -> None:
        """More numbers (and PNGs) at ``step`` outside the step sequence, e.g. a replay's predictions."""
        self.images(pngs, step)
        for w in self.workers:
            w.put(("scalars", step, dict(nums)))

    def render(self, fn, step: int) -> None:
        """Run ``fn() -> [PNG paths]`` on a thread of its own and log the PNGs at ``step``; skipped while the previous
        render is still going (a failure is a ``tracking_error``)."""
        if self.renderer is not None and self.renderer.is_alive():
            return

        def go() -> None:
            try:
                self.images(fn(), step)
            except Exception as exc:  # noqa: BLE001  (never fatal)
                with self.elock:
                    self.errors.append({"event": "tracking_error", "backend": "images",
                                        "error": f"{type(exc).__name__}: {exc}"[:300]})

        self.renderer = threading.Thread(target=go, name="tracking-images", daemon=True)
        self.renderer.start()

    def take_errors(self) -> list[dict]:
        with self.elock:
            out, self.errors[:] = list(self.errors), []
        return out

    def close(self, finished: bool = True, timeout: float | None = None) -> None:
        """Let each backend take what it holds, waiting at most ``timeout`` (tracking.close_timeout_s) in all."""
        timeout = self.cfg.close_timeout_s if timeout is None else timeout
        deadline = _CLOCK.now() + timeout
        for w in self.workers:
            w.deadline = deadline
            w.close(finished)
        for w in self.workers:
            w.join(max(0.0, deadline - _CLOCK.now()))

    def run_ids(self) -> dict[str, str]:
        return {w.b.name: w.state["run_id"] for w in self.workers if w.state.get("run_id")}
