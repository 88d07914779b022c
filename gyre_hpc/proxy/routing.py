"""The proxy's routing core: the engine registry and which engine each request of a run goes to. Pure (stdlib).

Words: an *engine* is one SGLang-protocol URL inside one *cell*; a *request* is one engine-side ``/generate``
(a harness call is one request, or several when it is moved); its *key* is unique while it is in flight.

Engine states::

    add ──▶ ACTIVE ──drain──▶ DRAINING ──remove──▶ (gone)
              ▲  └──mark_dead──▶ DEAD ─────remove──▶ (gone)
              └──── add again (the cell is back in rollout, or the engine was restarted)

Policies (``proxy.routing``):
- ``sticky_least_loaded``: a run's requests go to the run's assigned engine while it is ACTIVE (its prefix cache
  holds the run's context) and not overloaded; a run without one (new, or its engine left), or whose engine is
  overloaded while it has nothing in flight, gets the least-loaded ACTIVE engine: fewest requests in flight, ties
  to the engine added first. *Overloaded* is SGLang router's cache-aware balance rule: load - min > ``balance_abs``
  and load > ``balance_rel`` x min, min over the ACTIVE engines (``proxy.balance_abs_threshold``,
  ``proxy.balance_rel_threshold``).
- ``round_robin``: a run with no request in flight gets the next ACTIVE engine in rotation.

Re-spreading (``rebalance``): when an engine joins (a cell back in rollout), the requests that waited for any
engine at all have just landed on whichever joined first; ``rebalance`` names requests to move off each
overloaded engine, its newest first and only those alone on their run, down to the mean load of the ACTIVE
engines (the simulator's ``RolloutPool.rebalance`` when a cell returns to rollout). It changes no state: the
service aborts them there and routes their continuations afresh, avoiding the engine they left.

Invariants (each is tested in tests/unit/test_proxy_routing.py)
- A run is on at most one engine at a time: a run is assigned to at most one engine, every request started for
  it goes to that engine, so all of its requests in flight on engines that serve (ACTIVE) are on one engine.
  Requests left on a DRAINING or DEAD engine are being moved away, and their continuations join that engine too.
- A DRAINING or DEAD engine receives no new request; with no ACTIVE engine ``start`` raises ``NoEngineError``.
- ``drain``/``mark_dead`` return exactly the keys in flight on the engines they change (the requests to move);
  a DRAINING or DEAD engine becomes ACTIVE again (``add``) only once all of them have left it.
- Load is the number of requests in flight: ``start`` adds one, ``finish`` removes one; finishing an unknown key
  is a ``RoutingError`` (no double counting); ``remove`` refuses an engine that still has requests in flight.
- ``rebalance`` names only requests in flight on an overloaded ACTIVE engine whose run has no other request in
  flight, at most load - floor(mean) per engine, none when no engine is overloaded.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Iterable

from gyre_hpc.errors import GyreError

POLICIES = ("sticky_least_loaded", "round_robin")


class ProxyError(GyreError):
    """A proxy failure with the HTTP status the harness or admin caller gets (400 bad input, 503 no engine...)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class RoutingError(ProxyError):
    """An admin request that contradicts the registry (unknown engine, removing one that still serves)."""


class NoEngineError(ProxyError):
    """No ACTIVE engine can take the request."""

    def __init__(self, message: str = "no ACTIVE rollout engine"):
        super().__init__(message, status=503)


class EngineState(str, enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass
class Engine:
    name: str
    url: str
    cell: int
    order: int
    state: EngineState = EngineState.ACTIVE
    in_flight: dict[str, None] = field(default_factory=dict)  # keys in the order they started (an ordered set)

    @property
    def load(self) -> int:
        return len(self.in_flight)

    def describe(self) -> dict:
        return {"name": self.name, "url": self.url, "cell": self.cell, "state": self.state.value,
                "in_flight": self.load}


class Router:
    """The registry plus the run → engine assignment; every method is a plain state change, no I/O."""

    def __init__(self, policy: str = "sticky_least_loaded", balance_abs: int = 4, balance_rel: float = 1.5):
        if policy not in POLICIES:
            raise ProxyError(f"proxy.routing: {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy, self.balance_abs, self.balance_rel = policy, balance_abs, balance_rel
        self._engines: dict[str, Engine] = {}
        self._assigned: dict[str, str] = {}  # run id -> engine name
        self._requests: dict[str, tuple[str, str]] = {}  # key -> (run id, engine name)
        self._run_load: dict[str, int] = {}  # run id -> requests in flight
        self._order = itertools.count()
        self._rotation = 0

    # ---------------------------------------------------------------------------------------------- registry
    def add(self, name: str, url: str, cell: int) -> Engine:
        """Register an engine, or make a known one ACTIVE again (its URL and cell may change)."""
        if not name or not url:
            raise RoutingError("an engine needs a non-empty name and url")
        if isinstance(cell, bool) or not isinstance(cell, int) or cell < 0:
            raise RoutingError(f"cell: expected a cell index >= 0, got {cell!r}")
        for other in self._engines.values():
            if other.url == url and other.name != name:
                raise RoutingError(f"url {url} is already registered as engine {other.name!r}")
        eng = self._engines.get(name)
        if eng is not None and eng.state is not EngineState.ACTIVE and eng.in_flight:
            raise RoutingError(f"engine {name!r} is {eng.state.value} with {eng.load} request(s) still leaving it; "
                               f"add it again once they have left", 409)
        if eng is None:
            eng = self._engines[name] = Engine(name, url, cell, next(self._order))
        eng.url, eng.cell, eng.state = url, cell, EngineState.ACTIVE
        return eng

    def engine(self, name: str) -> Engine:
        try:
            return self._engines[name]
        except KeyError:
            known = ", ".join(self._engines) or "none"
            raise RoutingError(f"unknown engine {name!r}; known engines: {known}", status=404) from None

    def engines(self) -> list[Engine]:
        return sorted(self._engines.values(), key=lambda e: e.order)

    def cell_engines(self, cell: int) -> list[str]:
        names = [e.name for e in self.engines() if e.cell == cell]
        if not names:
            raise RoutingError(f"no engine is registered for cell {cell}", status=404)
        return names

    def active(self) -> list[Engine]:
        return [e for e in self.engines() if e.state is EngineState.ACTIVE]

    def drain(self, names: Iterable[str]) -> list[str]:
        """Mark engines DRAINING; returns the keys in flight on them (the requests to move)."""
        return self._leave(names, EngineState.DRAINING)

    def mark_dead(self, names: Iterable[str]) -> list[str]:
        """Mark engines DEAD; returns the keys in flight on them (their connections are lost)."""
        return self._leave(names, EngineState.DEAD)

    def _leave(self, names: Iterable[str], state: EngineState) -> list[str]:
        engines = [self.engine(n) for n in names]
        for eng in engines:
            if not (eng.state is EngineState.DEAD and state is EngineState.DRAINING):  # dead stays dead
                eng.state = state
        return sorted(k for eng in engines for k in eng.in_flight)

    def remove(self, name: str) -> Engine:
        eng = self.engine(name)
        if eng.in_flight:
            raise RoutingError(f"engine {name!r} still has {eng.load} request(s) in flight; drain it first", 409)
        if eng.state is EngineState.ACTIVE:
            raise RoutingError(f"engine {name!r} is ACTIVE; drain it (or mark it dead) before removing it", 409)
        del self._engines[name]
        self._assigned = {run: e for run, e in self._assigned.items() if e != name}
        return eng

    # ----------------------------------------------------------------------------------------------- routing
    def assigned(self, run_id: str) -> str | None:
        return self._assigned.get(run_id)

    def overloaded(self, eng: Engine, active: list[Engine] | None = None) -> bool:
        """SGLang router's balance rule against the least-loaded ACTIVE engine (module docstring); ``active``:
        ``self.active()`` when the caller already holds it."""
        low = min((e.load for e in (self.active() if active is None else active)), default=eng.load)
        return eng.load - low > self.balance_abs and eng.load > self.balance_rel * low

    def rebalance(self) -> list[str]:
        """Requests to move off overloaded ACTIVE engines, newest first, down to the mean load (no state change)."""
        active = self.active()
        if len(active) < 2:
            return []
        mean = sum(e.load for e in active) // len(active)
        keys: list[str] = []
        for eng in active:
            if not self.overloaded(eng, active):
                continue
            alone = [k for k in reversed(eng.in_flight) if self._run_load[self._requests[k][0]] == 1]
            keys += alone[:eng.load - mean]
        return keys

    def choose(self, run_id: str, avoid: Iterable[str] = ()) -> Engine:
        """The engine the run's next request goes to (no state change); ``avoid`` is a preference only."""
        active = self.active()
        if not active:
            raise NoEngineError()
        current = self._engines.get(self._assigned.get(run_id, ""))
        avoid = set(avoid)
        if current is not None and current.state is EngineState.ACTIVE:
            if self._run_load.get(run_id, 0):
                return current  # the run has requests in flight there: it stays on one engine
            if self.policy == "sticky_least_loaded" and current.name not in avoid \
                    and not self.overloaded(current, active):
                return current
        pool = [e for e in active if e.name not in avoid] or active
        if self.policy == "round_robin":
            return pool[self._rotation % len(pool)]
        return min(pool, key=lambda e: (e.load, e.order))

    def start(self, key: str, run_id: str, avoid: Iterable[str] = ()) -> Engine:
        """Choose an engine for request ``key`` of ``run_id``, assign the run to it and count the request."""
        if key in self._requests:
            raise RoutingError(f"request {key!r} is already in flight", 409)
        eng = self.choose(run_id, avoid)
        if self._assigned.get(run_id) != eng.name or not self._run_load.get(run_id, 0):
            self._rotation += 1
        self._assigned[run_id] = eng.name
        self._requests[key] = (run_id, eng.name)
        self._run_load[run_id] = self._run_load.get(run_id, 0) + 1
        eng.in_flight[key] = None
        return eng

    def finish(self, key: str) -> str:
        """Request ``key`` left its engine (answered, aborted, or its connection broke); returns the engine."""
        try:
            run_id, name = self._requests.pop(key)
        except KeyError:
            raise RoutingError(f"request {key!r} is not in flight") from None
        left = self._run_load[run_id] - 1
        if left:
            self._run_load[run_id] = left
        else:
            del self._run_load[run_id]
        if name in self._engines:
            self._engines[name].in_flight.pop(key, None)
        return name

    def where(self, key: str) -> str | None:
        entry = self._requests.get(key)
        return entry[1] if entry else None

    def release(self, run_id: str) -> None:
        """Forget a finished run's assignment (its next call, if any, is routed afresh)."""
        if not self._run_load.get(run_id, 0):
            self._assigned.pop(run_id, None)
