"""A cell leader's side of the allocator protocol: Hello/Welcome, heartbeats, orders in, events out, Bye.

The cell worker (``gyre_hpc.live``) owns what a role switch does; this link only speaks the protocol::

    link = CellLink(transport, cell=rank - 1, heartbeat_interval_s=cfg.heartbeat_interval_s)
    welcome = link.hello(timeout_s)          # starting role, core cell, streaming / mu
    while True:
        link.beat()                          # a Heartbeat if nothing was sent for heartbeat_interval_s
        order = link.next_order(0.05)        # SwitchTo | Shutdown | None
        ...                                  # link.send(SwitchDone(...)), link.send(TrainProgress(...))
        if isinstance(order, Shutdown):
            link.bye(); break

Invariants (tests/unit/test_allocator_transport.py)
- ``beat()`` sends a Heartbeat only when nothing at all was sent for ``heartbeat_interval_s``; heartbeats carry
  increasing sequence numbers.
- ``hello`` returns the Welcome addressed to this cell or raises ``CellLostError`` when none came in time.
- ``bye`` sends Bye and then closes the endpoint; nothing is sent after it.
"""
from __future__ import annotations

import os
import socket

from gyre_hpc.allocator.messages import Bye, Event, Heartbeat, Hello, OrderMessage, Welcome
from gyre_hpc.allocator.transport import ALLOCATOR, Transport
from gyre_hpc.errors import CellLostError, ProtocolError


class CellLink:
    def __init__(self, transport: Transport, cell: int, heartbeat_interval_s: float):
        self.transport, self.cell = transport, cell
        self.clock = transport.clock
        self.interval = heartbeat_interval_s
        self.last_sent = self.clock.now()
        self.seq = 0
        self.closed = False

    def send(self, msg: Event) -> None:
        if self.closed:
            raise ProtocolError(f"cell {self.cell} said Bye; {type(msg).__name__} cannot be sent")
        self.transport.send(ALLOCATOR, msg)
        self.last_sent = self.clock.now()

    def hello(self, timeout_s: float, node: str | None = None) -> Welcome:
        node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.send(Hello(cell=self.cell, rank=self.transport.rank, node=node, pid=os.getpid()))
        got = self.transport.recv(timeout_s)
        if got is None:
            raise CellLostError(f"cell {self.cell}: no Welcome from the allocator within {timeout_s} s")
        _, msg = got
        if not isinstance(msg, Welcome) or msg.cell != self.cell:
            raise ProtocolError(f"cell {self.cell}: expected its Welcome first, got {msg!r}")
        return msg

    def beat(self) -> bool:
        """Send a Heartbeat if the allocator has heard nothing for the interval; True if one was sent."""
        if self.clock.now() - self.last_sent < self.interval:
            return False
        self.seq += 1
        self.send(Heartbeat(cell=self.cell, seq=self.seq))
        return True

    def next_order(self, timeout_s: float) -> OrderMessage | None:
        """The next order, waiting up to ``timeout_s`` (0 = just look)."""
        got = self.transport.poll() if timeout_s <= 0 else self.transport.recv(timeout_s)
        return None if got is None else got[1]

    def bye(self) -> None:
        self.send(Bye(cell=self.cell))
        self.closed = True
        self.transport.close()
