"""The proxy's live core (asyncio): serves harness calls on engines, moves them off leaving engines, records TITO.

One event loop owns every piece of state (router, requests in flight, recorder, event log); the HTTP layer
(``server.py``) only parses and answers. Life of one harness call (``generate``)::

    loop until the output is complete:
        route          Router.start: the run's engine, or the least-loaded ACTIVE one (waits for one to appear)
        [move]         if the previous request was cut: mover.prepare(plan), log "move" with its cost
        request        POST /generate {prompt + partial so far, max_new_tokens - partial}
        classify the answer:
          finished (length/stop)              → last segment: done
          aborted by the harness              → done, finish reason abort
          aborted otherwise (drain, shutdown) → keep the partial tokens, move
          cancelled (engine marked dead)      → move from what was kept before this request
          no answer (connection broke)        → probe /health: dead → mark dead; alive → abort it there; move
          refused (HTTP 4xx/5xx)              → first request: the harness gets it; later: move elsewhere
    answer in SGLang's shape; record ONE TITO call

Invariants (tests/integration/test_proxy.py)
- The harness gets one answer per call; an error only for bad input (4xx), or when the call is lost: no ACTIVE
  engine within ``no_engine_wait_s`` while it was being moved, or more than ``max_moves_per_call`` moves. A lost
  call is logged (``call_lost``) and counted (``calls_lost``, ``runs_lost``).
- Every engine request started in the router is finished there exactly once (``finally``), so loads never drift.
- Each move is logged once with its cost (partial tokens, re-prefill tokens, seconds from the abort or the
  failure to the resubmission); engine lifecycle (add, drain, dead, remove) is in ``admin.py``.
- A call is recorded in TITO exactly when its answer goes back to the harness, unless its run's outcome was
  flushed meanwhile: such a late call is logged (``late_call``) and counted (``calls_late``), never written.
- A run's outcome reaches its file exactly once: by ``POST /tito/outcome`` (idempotent), or with the flush that
  names the run (``outcome_recovered`` when only the flush brought it; counted in ``outcomes_recovered``).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import ProxyConfig
from gyre_hpc.engines.client import AsyncEngineClient
from gyre_hpc.errors import EngineError
from gyre_hpc.proxy.admin import EngineAdmin, Request
from gyre_hpc.proxy.calls import CallRequest, CallSegment, answer, continuation, parse_call, produced, tito_call
from gyre_hpc.allocator.eventlog import EventLog
from gyre_hpc.proxy.events import proxy_log
from gyre_hpc.proxy.moveplan import MovePlan, Mover
from gyre_hpc.proxy.movers import make_mover
from gyre_hpc.proxy.recorder import TitoRecorder, tito_file
from gyre_hpc.proxy.routing import Engine, EngineState, NoEngineError, ProxyError, Router
from gyre_hpc.trajectory.records import Outcome

HARNESS_ABORT = {"type": "abort", "message": "aborted by the harness"}


@dataclass(frozen=True)
class _Move:
    reason: str
    source: Engine
    t0: float
    source_alive: bool
    partial: int  # tokens the source produced in the cut request


@dataclass(eq=False)
class _Call:
    req: CallRequest
    t_start: float
    segments: list[CallSegment] = field(default_factory=list)
    moves: int = 0
    harness_abort: bool = False
    current: Request | None = None


class ProxyService(EngineAdmin):
    def __init__(self, cfg: ProxyConfig, events: EventLog | None = None, mover: Mover | None = None,
                 clock: Clock | None = None):
        self.cfg = cfg
        self.clock = clock or WallClock()  # wall(): the calls' stamps in TITO (and the OpenAI answers' ``created``)
        self.router = Router(cfg.routing, cfg.balance_abs_threshold, cfg.balance_rel_threshold)
        self.events = events if events is not None else proxy_log(cfg.event_log)
        self.recorder = TitoRecorder()
        self.mover = mover if mover is not None else make_mover(cfg.mover, self.events, cfg.kv_version_policy,
                                                                         self.clock)
        self._clients: dict[str, AsyncEngineClient] = {}
        self._requests: dict[str, Request] = {}  # engine rid -> request
        self._calls: dict[str, _Call] = {}  # harness rid -> call
        self._keys = itertools.count()
        self._wake = asyncio.Event()
        self._shedding: set[asyncio.Task] = set()  # rebalance tasks in progress (admin.py)
        # prompt_tokens / cached_tokens: summed over engine answers (meta_info), the prefix cache's hit rate
        self.counts = {"calls_done": 0, "moves": 0, "calls_lost": 0, "calls_late": 0, "outcomes_recovered": 0,
                       "prompt_tokens": 0, "cached_tokens": 0, "moves_kv": 0, "moves_reprefill": 0}
        self._runs_moved: set[str] = set()
        self._runs_lost: set[str] = set()
        self._runs_moved_kv: set[str] = set()  # runs with at least one move whose KV blocks were transferred
        self._kv_move_s: list[float] = []  # mover.prepare seconds of each KV move

    # -------------------------------------------------------------------------------------------- calls
    async def generate(self, body: Any) -> dict:
        req = parse_call(body, self.cfg.default_max_new_tokens)
        if req.rid in self._calls:
            raise ProxyError(f"rid: call {req.rid!r} is already in flight", 409)
        self.recorder.reserve(req.run_id, req.call_id)
        call = self._calls[req.rid] = _Call(req, self.clock.wall())
        recorded = False
        try:
            await self._serve(call)
            if call.harness_abort and not (call.segments and call.segments[-1].aborted):
                call.segments.append(CallSegment("", (), (), (), HARNESS_ABORT))
            t_end = self.clock.wall()
            body = answer(req, call.segments, t_end - call.t_start, call.moves)
            recorded = True
            if not self.recorder.add_call(tito_call(req, call.segments, call.t_start, t_end)):
                self.counts["calls_late"] += 1  # its run's outcome was flushed meanwhile: never in a file
                self.events.write("late_call", rid=req.rid, run_id=req.run_id, call_id=req.call_id,
                                  output_tokens=len(produced(call.segments)), file=self.recorder.closed[req.run_id])
            self.counts["calls_done"] += 1
            if call.moves:
                self.events.write("moved_call_done", rid=req.rid, run_id=req.run_id, call_id=req.call_id,
                                  moves=call.moves, engines=body["meta_info"]["proxy"]["engines"],
                                  output_tokens=len(produced(call.segments)), seconds=t_end - call.t_start)
            return body
        except asyncio.CancelledError:
            self.events.write("call_cancelled", rid=req.rid, run_id=req.run_id, moves=call.moves)
            raise
        finally:
            del self._calls[req.rid]
            if not recorded:
                self.recorder.unreserve(req.run_id, req.call_id)

    async def _serve(self, call: _Call) -> None:
        move: _Move | None = None
        while not call.harness_abort:
            nxt = continuation(call.req, call.segments)
            if nxt is None:
                return
            if move is not None and call.moves >= self.cfg.max_moves_per_call:
                raise self._lost(call, f"moved {call.moves} times (proxy.max_moves_per_call)", 502)
            key = f"{call.req.rid}~{next(self._keys)}"
            try:
                eng = await self._start(key, call, [move.source.name] if move else [])
            except NoEngineError as exc:
                raise (self._lost(call, str(exc), 503) if move is not None else exc) from None
            if eng is None:  # the harness aborted the call while it waited for an engine
                return
            r = self._requests[key] = call.current = Request(key, eng)
            try:
                if move is not None:
                    if move.reason.startswith("refused"):  # an overloaded engine: do not bounce at full speed
                        await asyncio.sleep(self.cfg.abort_retry_s)
                    await self._log_move(call, move, eng, nxt[0])
                move = await self._run(call, r, *nxt, first=not call.segments and move is None)
            finally:
                del self._requests[key]
                call.current = None
                self.router.finish(key)
            if move is None:
                return

    async def _start(self, key: str, call: _Call, avoid: list[str]) -> Engine | None:
        """Route the call's next request, waiting up to ``no_engine_wait_s`` for an ACTIVE engine."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.no_engine_wait_s
        while not call.harness_abort:
            try:
                return self.router.start(key, call.req.run_id, avoid)
            except NoEngineError:
                left = deadline - loop.time()
                if left <= 0:
                    raise NoEngineError(f"no ACTIVE rollout engine for {self.cfg.no_engine_wait_s:g} s") from None
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
        return None

    async def _run(self, call: _Call, r: Request, input_ids: list[int], sampling: dict, first: bool) -> _Move | None:
        """One engine request; returns the move to make next, or None when the call is complete."""
        eng = r.engine
        if call.harness_abort:  # aborted while the move was being prepared: end with what it has
            return None
        if r.move_reason is not None:  # the engine left while the move was being prepared: never send it there
            return _Move(r.move_reason, eng, r.move_t0, r.move_reason != "dead", 0)
        r.task = asyncio.ensure_future(self._clients[eng.name].generate(input_ids, sampling, rid=r.key,
                                                                        return_logprob=True))
        try:
            await asyncio.wait({r.task})
        except asyncio.CancelledError:  # the harness hung up: dropping the connection makes the engine abort it
            r.task.cancel()
            raise
        now = asyncio.get_running_loop().time()
        if r.task.cancelled():  # mark_dead cancelled it: nothing came back
            return _Move(r.move_reason or "dead", eng, r.move_t0 or now, False, 0)
        exc = r.task.exception()
        if exc is None:
            seg = CallSegment.of(eng.name, r.task.result())
            self.counts["prompt_tokens"] += r.task.result().prompt_tokens
            self.counts["cached_tokens"] += r.task.result().cached_tokens
            if not seg.aborted or call.harness_abort:
                call.segments.append(seg)
                return None
            call.segments += [seg] if seg.output_ids else []
            return _Move(r.move_reason or "engine_abort", eng, r.move_t0 or now, True, len(seg.output_ids))
        if not isinstance(exc, EngineError):
            raise exc
        if exc.status is None:
            alive = await self._probe(eng, str(exc))
            if alive:
                with contextlib.suppress(EngineError):
                    await self._clients[eng.name].abort(r.key)
            return _Move("broken" if alive else "dead", eng, r.move_t0 or now, alive, 0)
        if first and exc.status != 503:
            raise ProxyError(str(exc), exc.status)
        return _Move(f"refused ({exc.status})", eng, now, True, 0)

    async def _probe(self, eng: Engine, what: str) -> bool:
        """After a broken connection: is the engine still there? If not, mark it dead (moving its other requests)."""
        if eng.state is EngineState.DEAD:
            return False
        client = self._clients.get(eng.name)
        if client is not None and await client.health(timeout=self.cfg.health_timeout_s):
            return True
        if eng.name in self._clients and self.router.engine(eng.name).state is not EngineState.DEAD:
            self.mark_dead(engine=eng.name, reason=f"no answer to /generate ({what}) and none to /health")
        return False

    async def _log_move(self, call: _Call, move: _Move, target: Engine, tokens: list[int]) -> None:
        plan = MovePlan(call.req.rid, move.source.name, move.source.url, move.source_alive, target.name, target.url,
                        tuple(tokens))
        cost = await self.mover.prepare(plan)
        call.moves += 1
        self.counts["moves"] += 1
        self._runs_moved.add(call.req.run_id)
        kind = "kv" if cost.moved_tokens > 0 else "reprefill"
        self.counts[f"moves_{kind}"] += 1
        if kind == "kv":
            self._runs_moved_kv.add(call.req.run_id)
            self._kv_move_s.append(cost.seconds)
        self.events.write(
            "move", rid=call.req.rid, run_id=call.req.run_id, call_id=call.req.call_id, reason=move.reason,
            from_engine=move.source.name, from_cell=move.source.cell, to_engine=target.name, to_cell=target.cell,
            partial_tokens=move.partial, output_tokens=len(produced(call.segments)),
            reprefill_tokens=cost.reprefill_tokens, moved_tokens=cost.moved_tokens,
            seconds=asyncio.get_running_loop().time() - move.t0, mover=self.mover.name, move=call.moves,
            kind=kind, prepare_s=cost.seconds)

    def _lost(self, call: _Call, why: str, status: int) -> ProxyError:
        self.counts["calls_lost"] += 1
        self._runs_lost.add(call.req.run_id)
        self.events.write("call_lost", rid=call.req.rid, run_id=call.req.run_id, call_id=call.req.call_id,
                          reason=why, output_tokens=len(produced(call.segments)), moves=call.moves)
        return ProxyError(f"call {call.req.rid} lost: {why}", status)

    async def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """The harness aborts its own calls: they end with what they have (finish reason abort), never moved."""
        calls = list(self._calls.values()) if abort_all else [self._calls[rid]] if rid in self._calls else []
        for call in calls:
            call.harness_abort = True
        self._wake.set()  # calls waiting for an engine stop waiting
        await asyncio.gather(*(self._abort_current(c) for c in calls))
        return len(calls)

    async def _abort_current(self, call: _Call) -> None:
        r = call.current
        if r is not None:
            with contextlib.suppress(EngineError):
                await self._clients[r.engine.name].abort(r.key)

    # ------------------------------------------------------------------------------------------- status
    def record_outcome(self, outcome: Outcome) -> None:
        self.recorder.add_outcome(outcome)
        self.router.release(outcome.run_id)

    def flush_tito(self, name: str, run_ids: Iterable[str] | None = None,
                   outcomes: Iterable[Outcome] | None = None) -> dict:
        """Flush into ``<proxy.tito_dir>/<name>`` (``recorder.tito_file``), never anywhere else; ``outcomes`` are
        written for runs whose outcome never came by ``POST /tito/outcome``."""
        path = tito_file(self.cfg.tito_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        done = self.recorder.flush(path, run_ids, outcomes)
        for run_id in done["recovered"]:  # its outcome never came by POST /tito/outcome (or not yet)
            self.counts["outcomes_recovered"] += 1
            self.events.write("outcome_recovered", run_id=run_id, file=done["path"])
        return done

    def stats(self) -> dict:
        return {**self.counts, "calls_in_flight": len(self._calls), "runs_moved": len(self._runs_moved),
                "runs_moved_kv": len(self._runs_moved_kv),
                "kv_move_median_s": statistics.median(self._kv_move_s) if self._kv_move_s else None,
                "runs_lost": len(self._runs_lost), "tito_pending": self.recorder.pending(),
                "engines": [e.describe() for e in self.router.engines()]}

    async def aclose(self) -> None:
        for task in list(self._shedding):
            task.cancel()
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        if hasattr(self.mover, "aclose"):
            await self.mover.aclose()
        self.events.close()
