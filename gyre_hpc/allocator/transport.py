"""How messages travel between ranks: one small interface, an in-process implementation, polling with back-off.

A ``Transport`` is one rank's endpoint in a world of ``size`` ranks (rank 0 = the allocator, rank c + 1 =
cell c). ``send(dest, msg)`` puts ``msg.to_dict()`` on the wire; ``poll()`` returns the next
``(source, message)`` or None without waiting; ``recv(timeout)`` polls with exponential back-off on the
transport's clock. Each endpoint decodes one direction: the allocator's endpoint accepts events, a cell's
accepts orders. ``InProcessTransport`` (threads in one process, ``queue.Queue``) and ``MpiTransport``
(``mpi_transport.py``) have the same behaviour, so the server and cell loops are tested without MPI.

Invariants (tests/unit/test_allocator_transport.py)
- Messages from one source to one destination arrive in the order they were sent, each exactly once.
- Every message crosses the wire as plain data (``to_dict`` → ``decode``), in-process too; a payload that does
  not decode raises ``ProtocolError`` carrying the source rank, and the endpoint stays usable.
- ``Backoff`` waits start at ``min_s``, double after every empty poll, never exceed ``max_s`` nor the time left.
- An endpoint's back-off carries over from one ``recv`` to the next until a message arrives (then it restarts at
  ``min_s``): a loop of short ``recv`` calls polls no faster than one long call, and never waits longer than
  ``backoff_max_s`` between polls either (an idle cell's loop of 2 ms calls polled ~5 times each).
- ``InProcessTransport`` is thread-safe: any number of threads may send to one endpoint concurrently.
- Sending to a closed endpoint raises ``CellLostError`` (the receiver is gone), never blocks.
"""
from __future__ import annotations

import abc
import queue
from typing import Any, Mapping

from gyre_hpc.allocator.messages import EVENTS, ORDERS, Message, decode
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.errors import CellLostError

ALLOCATOR = 0


class Backoff:
    """Exponential back-off for polling: ``wait()`` after an empty poll, ``reset()`` after a message."""

    def __init__(self, clock: Clock, min_s: float = 1e-4, max_s: float = 5e-3):
        if not 0 < min_s <= max_s:
            raise ValueError(f"back-off needs 0 < min_s <= max_s, got {min_s}, {max_s}")
        self.clock, self.min_s, self.max_s = clock, min_s, max_s
        self.delay = min_s

    def reset(self) -> None:
        self.delay = self.min_s

    def wait(self, limit: float | None = None) -> None:
        dt = self.delay if limit is None else max(0.0, min(self.delay, limit))
        self.clock.sleep(dt)
        self.delay = min(self.delay * 2, self.max_s)


class Transport(abc.ABC):
    """One rank's endpoint. Subclasses implement ``_put`` and ``_get`` (raw plain-data payloads)."""

    def __init__(self, rank: int, size: int, clock: Clock | None = None, backoff_max_s: float = 5e-3):
        self.rank, self.size = rank, size
        self.clock = clock or WallClock()
        self.kinds: Mapping[str, type] = EVENTS if rank == ALLOCATOR else ORDERS
        self._idle = Backoff(self.clock, min(1e-4, backoff_max_s), backoff_max_s)  # across recv calls

    def send(self, dest: int, msg: Message) -> None:
        if not 0 <= dest < self.size or dest == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {dest} (world of {self.size})")
        self._put(dest, msg.to_dict())

    def poll(self) -> tuple[int, Message] | None:
        got = self._get()
        if got is None:
            return None
        self._idle.reset()
        source, data = got
        return source, decode(data, self.kinds, source)

    def recv(self, timeout: float) -> tuple[int, Message] | None:
        """The next message, polling with back-off for up to ``timeout`` seconds of this clock (the back-off
        continues where the last call left it while nothing arrives)."""
        deadline = self.clock.now() + timeout
        while True:
            got = self.poll()
            if got is not None:
                return got
            left = deadline - self.clock.now()
            if left <= 0:
                return None
            self._idle.wait(left)

    @abc.abstractmethod
    def _put(self, dest: int, data: dict[str, Any]) -> None:
        """Deliver ``data`` to rank ``dest``; raise ``CellLostError`` if it can no longer be reached."""

    @abc.abstractmethod
    def _get(self) -> tuple[int, Any] | None:
        """The next raw ``(source, payload)`` addressed to this rank, or None."""

    def close(self) -> None:
        """Release the endpoint (after the orderly shutdown)."""


class InProcessWorld:
    """``size`` ranks in one process: one thread-safe queue per rank."""

    def __init__(self, size: int):
        self.size = size
        self.queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(size)]
        self.closed = [False] * size

    def endpoint(self, rank: int, clock: Clock | None = None, backoff_max_s: float = 5e-3) -> InProcessTransport:
        return InProcessTransport(self, rank, clock, backoff_max_s)


class InProcessTransport(Transport):
    def __init__(self, world: InProcessWorld, rank: int, clock: Clock | None = None, backoff_max_s: float = 5e-3):
        super().__init__(rank, world.size, clock, backoff_max_s)
        self.world = world

    def _put(self, dest: int, data: dict[str, Any]) -> None:
        if self.world.closed[dest]:
            raise CellLostError(f"rank {dest} has closed its endpoint; {data.get('type')} not delivered")
        self.world.queues[dest].put((self.rank, data))

    def _get(self) -> tuple[int, Any] | None:
        try:
            return self.world.queues[self.rank].get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        self.world.closed[self.rank] = True
