"""Engine lifecycle in the proxy: add, drain, mark dead, remove (the allocator's and cell runner's side).

A cell leaving rollout is ``drain(cell=c)`` then ``remove(cell=c)``; a cell coming back is ``add_engine`` again;
an engine found dead (heartbeat lost, process gone) is ``mark_dead``. The proxy also marks an engine dead itself
when a request's connection broke and ``/health`` does not answer.

Invariants (tests/integration/test_proxy.py)
- Each state change of an engine is logged once (engine_added, engine_draining, engine_drained, engine_dead,
  engine_removed).
- ``drain`` returns once no request is left on the drained engines (each was aborted, its partial output taken
  and its continuation submitted elsewhere), or after ``timeout_s`` with the keys still there in ``left``;
  ``/abort_request`` is re-sent every ``abort_retry_s`` to a request the engine had not received yet.
- ``mark_dead`` cancels the engine requests in flight there (their connections are dropped); each is resubmitted
  from the output kept before it (nothing partial comes back from a dead engine).
- ``add_engine`` re-spreads: the requests ``Router.rebalance`` names (on overloaded engines, down to the mean) are
  aborted there and continue elsewhere like a drained engine's (move reason ``rebalance``), logged once per add
  (``rebalance``, with the loads); a request flagged for a drain or a death keeps that reason.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Callable

from gyre_hpc.engines.client import AsyncEngineClient
from gyre_hpc.errors import EngineError
from gyre_hpc.proxy.routing import Engine, EngineState, ProxyError


@dataclass(eq=False)
class Request:
    """One engine request in flight."""

    key: str
    engine: Engine
    task: asyncio.Task | None = None
    move_reason: str | None = None
    move_t0: float | None = None
    abort_sent: float = float("-inf")


class EngineAdmin:
    """Mixed into ``ProxyService``; uses its ``cfg``, ``router``, ``events``, ``_clients``, ``_requests``, ``_wake``."""

    def add_engine(self, url: str, cell: int, name: str | None = None) -> Engine:
        name = name or url.rstrip("/")
        eng = self.router.add(name, url.rstrip("/"), cell)
        old = self._clients.get(name)
        if old is None or old.url != eng.url:
            self._clients[name] = AsyncEngineClient(eng.url, timeout=self.cfg.request_timeout_s,
                                                    connect_retries=self.cfg.connect_retries)
            if old is not None:
                asyncio.ensure_future(old.aclose())
        self.events.write("engine_added", engine=name, url=eng.url, cell=cell)
        self._wake.set()
        keys = self.router.rebalance()
        if keys:
            self.events.write("rebalance", engine=name, cell=cell, moving=len(keys),
                              loads={e.name: e.load for e in self.router.active()})
            task = asyncio.ensure_future(self._shed(keys))
            self._shedding.add(task)
            task.add_done_callback(self._shedding.discard)
        return eng

    async def _shed(self, keys: list[str]) -> None:
        """Move requests off the engines they are on (``Router.rebalance``): abort each there, re-sent every
        ``abort_retry_s`` until it has left that engine or ``drain_timeout_s`` passed; its call's loop routes the
        continuation afresh, avoiding the engine it left (move reason ``rebalance``)."""
        t0 = asyncio.get_running_loop().time()
        where = {k: r.engine.name for k in keys if (r := self._flag(k, "rebalance", t0)) is not None}
        await self._abort_until_gone(lambda: [k for k, name in where.items() if self.router.where(k) == name],
                                     t0 + self.cfg.drain_timeout_s, "rebalance")

    async def _abort_until_gone(self, left: Callable[[], list[str]], deadline: float, reason: str) -> list[str]:
        """Abort the keys ``left()`` names (re-sent every ``abort_retry_s``) until it names none or ``deadline``
        passed; returns the keys still there."""
        loop = asyncio.get_running_loop()
        while (keys := left()) and loop.time() < deadline:
            await asyncio.gather(*(self._abort_request(k, loop.time(), reason) for k in keys))
            await asyncio.sleep(min(self.cfg.abort_retry_s, 0.05))
        return keys

    def _names(self, engine: str | None, cell: int | None) -> list[str]:
        if (engine is None) == (cell is None):
            raise ProxyError("give exactly one of 'engine' (a name) or 'cell' (an index)")
        return [self.router.engine(engine).name] if engine is not None else self.router.cell_engines(cell)

    async def drain(self, engine: str | None = None, cell: int | None = None,
                    timeout_s: float | None = None) -> dict:
        """Stop routing to the engines and move their requests elsewhere; returns once none is left there."""
        names = self._names(engine, cell)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        keys = self.router.drain(names)
        for name in names:
            eng = self.router.engine(name)
            self.events.write("engine_draining", engine=name, cell=eng.cell, in_flight=eng.load)
        for key in keys:
            self._flag(key, "drain", t0)
        deadline = t0 + (self.cfg.drain_timeout_s if timeout_s is None else timeout_s)
        left = await self._abort_until_gone(lambda: [k for n in names for k in sorted(self.router.engine(n).in_flight)],
                                            deadline, "drain")
        seconds = loop.time() - t0
        for name in names:
            self.events.write("engine_drained", engine=name, cell=self.router.engine(name).cell, moved=len(keys),
                              seconds=seconds, left=len(self.router.engine(name).in_flight))
        return {"engines": names, "moved": len(keys), "left": left, "seconds": seconds}

    def _flag(self, key: str, reason: str, t0: float) -> Request | None:
        r = self._requests.get(key)
        if r is not None and r.move_reason is None:
            r.move_reason, r.move_t0 = reason, t0
        return r

    async def _abort_request(self, key: str, now: float, reason: str = "drain") -> None:
        r = self._requests.get(key)
        if r is None or now - r.abort_sent < self.cfg.abort_retry_s:
            return
        self._flag(key, reason, now)
        r.abort_sent = now
        with contextlib.suppress(EngineError):
            await self._clients[r.engine.name].abort(key)

    def mark_dead(self, engine: str | None = None, cell: int | None = None, reason: str = "reported dead") -> dict:
        """The engines died: their requests' connections are dropped and the requests resubmitted elsewhere."""
        names = self._names(engine, cell)
        now = asyncio.get_running_loop().time()
        keys = []
        for name in names:
            eng = self.router.engine(name)
            if eng.state is EngineState.DEAD:
                continue
            keys += self.router.mark_dead([name])
            self.events.write("engine_dead", engine=name, cell=eng.cell, reason=reason, in_flight=eng.load)
        for key in keys:
            r = self._flag(key, "dead", now)
            if r is not None and r.task is not None:
                r.task.cancel()
        return {"engines": names, "moved": len(keys)}

    async def remove(self, engine: str | None = None, cell: int | None = None) -> dict:
        """Forget engines (a cell left rollout for good); engines still serving are drained first."""
        names = self._names(engine, cell)
        moved = 0
        for name in names:
            if self.router.engine(name).state is EngineState.ACTIVE or self.router.engine(name).in_flight:
                moved += (await self.drain(engine=name))["moved"]
            eng = self.router.remove(name)
            client = self._clients.pop(name, None)
            if client is not None:
                await client.aclose()
            self.events.write("engine_removed", engine=name, cell=eng.cell)
        return {"engines": names, "moved": moved}

