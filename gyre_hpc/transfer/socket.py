"""Plain TCP socket transport: the baseline the Mooncake throughput is measured against.

The publisher serves its current buffer with a ``socketserver.ThreadingTCPServer`` on ``transfer.host``
(an ephemeral port; ``location`` is ``"host:port"``). Wire protocol per request, little-endian::

    puller -> publisher   address u64 | length u64
    publisher -> puller   status u8 (0 ok, 1 outside the buffer, 2 closed) | length bytes (only when ok)

The puller keeps one connection per publisher and issues one request per chunk (``recv_into`` straight into
its destination, no intermediate copy).

Invariants
- A request outside the publisher's current buffer gets status 1 and becomes a ``TransferError``; the
  connection stays usable.
- Any socket error or a silence longer than ``transfer.timeout_s`` is a ``TransferError`` naming the peer and
  the chunks; the connection is dropped and the destination buffer is never reused.
- ``close`` stops the server thread and closes every socket.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.base import BufferPublisher, BufferPuller, describe_chunks

_REQUEST = struct.Struct("<QQ")
_REFUSALS = {b"\x01": "address outside the published buffer", b"\x02": "the publisher is closed"}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            header = _recv_exact(self.request, _REQUEST.size)
            if header is None:
                return
            address, length = _REQUEST.unpack(header)
            buf = self.server.publisher.buffer
            if buf is None:
                self.request.sendall(b"\x02")
                continue
            start = address - int(buf.ctypes.data)
            if start < 0 or start + length > len(buf):
                self.request.sendall(b"\x01")
                continue
            self.request.sendall(b"\x00")
            self.request.sendall(memoryview(buf)[start:start + length])


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            return None
        data += part
    return bytes(data)


class SocketPublisher(BufferPublisher):
    backend = "socket"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self.buffer: np.ndarray | None = None
        self._previous: np.ndarray | None = None
        self._server = socketserver.ThreadingTCPServer((cfg.host, 0), _Handler)
        self._server.daemon_threads = True
        self._server.publisher = self
        self.location = f"{cfg.host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="gyre-socket-publisher",
                                        daemon=True)
        self._thread.start()

    def _reserve(self, nbytes: int) -> np.ndarray:
        if self.buffer is None or len(self.buffer) < nbytes:
            self._previous, self.buffer = self.buffer, np.empty(nbytes, dtype=np.uint8)
        return self.buffer

    def _release(self) -> None:
        self.buffer = self._previous = None  # open connections now get "closed" answers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class SocketPuller(BufferPuller):
    backend = "socket"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self._dst: np.ndarray | None = None
        self._conns: dict[str, socket.socket] = {}

    def _reserve(self, nbytes: int) -> np.ndarray:
        if self._dst is None or len(self._dst) < nbytes:
            self._dst = np.empty(nbytes, dtype=np.uint8)
        return self._dst

    def _read(self, descriptor, dst, chunks) -> None:
        try:
            sock = self._connect(descriptor.location)
            for offset, length in chunks:
                sock.sendall(_REQUEST.pack(descriptor.address + offset, length))
                status = _recv_exact(sock, 1)
                if status in _REFUSALS:
                    raise TransferError(f"{_REFUSALS[status]}: {describe_chunks(descriptor, chunks)}")
                if status != b"\x00":
                    raise OSError("connection closed by the publisher")
                view = memoryview(dst)[offset:offset + length]
                while len(view):
                    got = sock.recv_into(view)
                    if not got:
                        raise OSError("connection closed by the publisher mid-chunk")
                    view = view[got:]
        except OSError as exc:
            self._drop(descriptor.location)
            raise TransferError(f"socket read failed ({exc}): {describe_chunks(descriptor, chunks)}") from None

    def _connect(self, location: str) -> socket.socket:
        if location not in self._conns:
            host, _, port = location.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=self.cfg.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns[location] = sock
        return self._conns[location]

    def _drop(self, location: str) -> None:
        sock = self._conns.pop(location, None)
        if sock is not None:
            sock.close()

    def _discard(self, dst) -> None:
        if dst is self._dst:
            self._dst = None

    def _release(self) -> None:
        for location in list(self._conns):
            self._drop(location)
        self._dst = None
