"""Typed messages between the allocator (rank 0) and the cells (ranks 1..K), as plain data.

Cell → allocator (**events**): ``Hello`` (the cell is up), ``Heartbeat``, ``SwitchDone`` (a role transition
finished, with its timing breakdown), ``RunsChanged`` (where the unfinished runs are), ``GroupsReady`` (groups
whose runs all ended), ``TrainProgress`` (groups processed, optimizer step done → new version),
``EngineDied`` / ``EngineRestarted`` (a rollout cell's engine process exited on its own, and the cell started a new
one), ``CellFailed`` (the cell gave up, e.g. its engine died and did not come back), ``Bye`` (answer to Shutdown).
``RunsChanged`` and ``GroupsReady`` usually come from rank 0 itself (the proxy knows where runs are, the
harness when groups complete); they take the same path through ``AllocatorServer.post``.

Allocator → cell (**orders**): ``Welcome`` (answer to Hello: starting role, which cell is the core, and the
policy facts the trainer follows), ``SwitchTo`` (move to TRAIN or ROLLOUT; ``order`` numbers it so the
``SwitchDone`` names what it answers), ``Shutdown``.

Wire form: ``to_dict()`` gives ``{"type": "SwitchDone", ...fields}`` with roles as their string values, so a
message goes over MPI (pickle) or into a JSON log unchanged; ``decode(data, EVENTS)`` is its inverse.

Invariants (tests/unit/test_allocator_messages.py)
- ``decode(m.to_dict(), kinds) == m`` for every message, also after a JSON round trip.
- A message cannot exist in an invalid form: construction validates every field (type, range) and raises
  ``ProtocolError`` naming ``Type.field`` and the bad value; ``decode`` adds unknown types, unknown or
  missing fields, and messages of the wrong direction (an order where an event is expected).
- Messages are frozen; ``SwitchDone.timing`` is copied on construction (durations in seconds, keys end in ``_s``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from gyre_hpc.allocator.types import Role
from gyre_hpc.errors import ProtocolError

_COUNTS = ("cell", "rank", "pid", "seq", "ended", "groups", "version", "order", "core")


_PREDICATES = {
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    bool: lambda v: isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    Role: lambda v: isinstance(v, Role),
    tuple: lambda v: isinstance(v, (tuple, list)),
    dict: lambda v: isinstance(v, dict),
}


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> tuple[tuple[str, type, bool], ...]:
    """(field, base type, None allowed) per field of a message class, resolved once."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
        if optional:
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        out.append((f.name, tp, optional))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _layout(cls: type) -> tuple[frozenset[str], tuple[str, ...]]:
    """(all field names, required field names) of a message class."""
    fields = dataclasses.fields(cls)
    required = tuple(f.name for f in fields
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return frozenset(f.name for f in fields), required


@dataclass(frozen=True)
class _Message:
    def __post_init__(self) -> None:
        for name, tp, optional in _hints(type(self)):
            v = getattr(self, name)
            if not (optional and v is None):
                _check_type(type(self).__name__, name, tp, v)
        for name in _COUNTS:
            v = getattr(self, name, 0)
            if v is not None and v < 0:
                raise ProtocolError(f"{type(self).__name__}.{name}: must be >= 0, got {v}")
        self._check()

    def _check(self) -> None:
        """Message-specific checks beyond types and non-negative counts."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": type(self).__name__}
        for name, _, _ in _hints(type(self)):
            v = getattr(self, name)
            out[name] = (v.value if isinstance(v, Role) else dict(v) if isinstance(v, dict)
                           else list(v) if isinstance(v, tuple) else v)
        return out


def _check_type(kind: str, name: str, tp: type, v: Any) -> None:
    if not _PREDICATES[tp](v):
        raise ProtocolError(f"{kind}.{name}: expected {tp.__name__}, got {v!r}")


def _check_counts(msg: _Message, name: str) -> None:
    """Every item of the tuple field ``name`` is an int >= 0."""
    kind = type(msg).__name__
    for i, n in enumerate(getattr(msg, name)):
        _check_type(kind, f"{name}[{i}]", int, n)
        if n < 0:
            raise ProtocolError(f"{kind}.{name}[{i}]: must be >= 0, got {n}")


def _nonneg(msg: _Message, *names: str) -> None:
    for name in names:
        if getattr(msg, name) < 0:
            raise ProtocolError(f"{type(msg).__name__}.{name}: must be >= 0, got {getattr(msg, name)}")


# ------------------------------------------------------------------------------------ cell → allocator
@dataclass(frozen=True)
class Hello(_Message):
    cell: int
    rank: int
    node: str = ""
    pid: int = 0


@dataclass(frozen=True)
class Heartbeat(_Message):
    cell: int
    seq: int = 0


@dataclass(frozen=True)
class SwitchDone(_Message):
    """The cell is now in ``role``; ``timing`` breaks the transition down (drain_s, weight_pull_s, ...)."""

    cell: int
    role: Role
    order: int
    timing: dict = field(default_factory=dict)

    def _check(self) -> None:
        if self.role not in (Role.TRAIN, Role.ROLLOUT):
            raise ProtocolError(f"SwitchDone.role: a switch ends in train or rollout, got {self.role.value!r}")
        object.__setattr__(self, "timing", dict(self.timing))
        for key, v in self.timing.items():
            if not (isinstance(key, str) and key.endswith("_s")):
                raise ProtocolError(f"SwitchDone.timing: keys are durations named *_s, got {key!r}")
            _check_type("SwitchDone", f"timing.{key}", float, v)
            if v < 0:
                raise ProtocolError(f"SwitchDone.timing.{key}: must be >= 0, got {v}")


@dataclass(frozen=True)
class RunsChanged(_Message):
    """A snapshot from the proxy: ``runs[c]`` unfinished runs are on cell c now, and ``ended`` runs have ended
    (finished, timed out or failed) since the start. Both absolute, so a newer snapshot supersedes an older."""

    runs: tuple
    ended: int

    def _check(self) -> None:
        object.__setattr__(self, "runs", tuple(self.runs))
        _check_counts(self, "runs")


@dataclass(frozen=True)
class GroupsReady(_Message):
    """``groups`` groups had all their runs end; training them costs ``work_s`` cell-seconds (estimate)."""

    groups: int
    work_s: float = 0.0

    def _check(self) -> None:
        _nonneg(self, "work_s")


@dataclass(frozen=True)
class TrainProgress(_Message):
    """A training cell processed ``groups`` more groups (``work_s`` cell-seconds); the core also reports
    ``version`` (its policy version after this report: one more than before = an optimizer step finished,
    with ``mean_lag`` the batch's mean per-token lag over its ``lag_tokens`` trained tokens) and whether an
    optimizer step is under way."""

    cell: int
    version: int
    groups: int = 0
    work_s: float = 0.0
    optimizing: bool = False
    mean_lag: float = 0.0
    lag_tokens: float = 0.0

    def _check(self) -> None:
        _nonneg(self, "work_s", "mean_lag", "lag_tokens")


@dataclass(frozen=True)
class EngineDied(_Message):
    """Cell ``cell``'s engine process ``pid`` exited on its own with ``exit_code`` (Popen's: -N = killed by signal
    N). The proxy moved ``calls_moved`` of its calls (of ``runs_moved`` runs) to other engines; ``calls_lost``
    of them could not be moved. Information only: the cell stays in its role and restarts the engine."""

    cell: int
    pid: int
    exit_code: int
    engine: str = ""
    calls_moved: int = 0
    runs_moved: int = 0
    calls_lost: int = 0

    def _check(self) -> None:
        _nonneg(self, "calls_moved", "runs_moved", "calls_lost")


@dataclass(frozen=True)
class EngineRestarted(_Message):
    """Cell ``cell`` serves again: engine ``pid`` (``engine`` in the proxy) started in ``start_s`` seconds on
    weights of ``version``; ``restarts`` counts this cell's restarts so far."""

    cell: int
    pid: int
    start_s: float
    version: int
    engine: str = ""
    restarts: int = 1

    def _check(self) -> None:
        _nonneg(self, "start_s")
        if self.restarts < 1:
            raise ProtocolError(f"EngineRestarted.restarts: must be >= 1, got {self.restarts}")


@dataclass(frozen=True)
class CellFailed(_Message):
    cell: int
    reason: str


@dataclass(frozen=True)
class Bye(_Message):
    cell: int


# ------------------------------------------------------------------------------------ allocator → cell
@dataclass(frozen=True)
class Welcome(_Message):
    """Answer to Hello: start in ``role``; ``core`` is the core cell; the trainer follows ``streaming``/``mu``."""

    cell: int
    role: Role
    core: int
    streaming: bool
    mu: int | None

    def _check(self) -> None:
        if self.role not in (Role.TRAIN, Role.ROLLOUT):
            raise ProtocolError(f"Welcome.role: a cell starts in train or rollout, got {self.role.value!r}")
        if self.mu is not None and self.mu < 1:
            raise ProtocolError(f"Welcome.mu: must be >= 1 or None, got {self.mu}")


@dataclass(frozen=True)
class SwitchTo(_Message):
    cell: int
    role: Role
    order: int

    def _check(self) -> None:
        if self.role not in (Role.TRAIN, Role.ROLLOUT):
            raise ProtocolError(f"SwitchTo.role: a cell switches to train or rollout, got {self.role.value!r}")


@dataclass(frozen=True)
class Shutdown(_Message):
    """Stop now. ``lost`` names the cells that were lost: with a dead peer an MPI rank must not finalize
    (``mpi_transport.exit_process``)."""

    reason: str = ""
    lost: tuple = ()

    def _check(self) -> None:
        object.__setattr__(self, "lost", tuple(self.lost))
        _check_counts(self, "lost")


Event = (Hello | Heartbeat | SwitchDone | RunsChanged | GroupsReady | TrainProgress | EngineDied | EngineRestarted
         | CellFailed | Bye)
OrderMessage = Welcome | SwitchTo | Shutdown
Message = Event | OrderMessage
EVENTS: Mapping[str, type] = {c.__name__: c for c in typing.get_args(Event)}
ORDERS: Mapping[str, type] = {c.__name__: c for c in typing.get_args(OrderMessage)}


def decode(data: Any, kinds: Mapping[str, type], source: int | None = None) -> Message:
    """The message ``data`` (a ``to_dict()``) describes; ``kinds`` is EVENTS or ORDERS (the direction)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        raise ProtocolError(f"a message is a mapping with a string 'type', got {data!r}", source)
    name = data["type"]
    cls = kinds.get(name)
    if cls is None:
        other = "an order" if name in ORDERS else "an event" if name in EVENTS else "an unknown message type"
        raise ProtocolError(f"{name!r} is {other} here; expected one of {', '.join(kinds)}", source)
    fields, required = _layout(cls)
    unknown = sorted(k for k in data if k not in fields and k != "type")
    if unknown:
        order = ", ".join(n for n, _, _ in _hints(cls))
        raise ProtocolError(f"{name}.{unknown[0]}: unknown field; fields of {name}: {order}", source)
    missing = [n for n in required if n not in data]
    if missing:
        raise ProtocolError(f"{name}.{missing[0]}: missing", source)
    kwargs = {k: v for k, v in data.items() if k != "type"}
    if "role" in kwargs:
        try:
            kwargs["role"] = Role(kwargs["role"])
        except ValueError:
            raise ProtocolError(f"{name}.role: {kwargs['role']!r} is not one of "
                                f"{', '.join(r.value for r in Role)}", source) from None
    try:
        return cls(**kwargs)
    except ProtocolError as exc:
        raise ProtocolError(str(exc), source) from None
