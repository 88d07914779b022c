"""In-process stand-in for the weight transfer: the same publish/pull contract, the wire replaced by memcpy.

For unit tests and single-process runs. A publisher registers itself in a process-local registry under its
``location`` (``inprocess:<pid>:<n>``); a puller in the same process looks it up and copies the requested
byte ranges out of the publisher's *current* buffer, exactly as Mooncake reads a registered buffer.

Invariants
- A read outside the publisher's current buffer (a stale address after the buffer grew, a forged descriptor)
  is a ``TransferError``, as Mooncake rejects addresses outside its registered memory.
- A closed publisher (or one in another process) cannot be read: ``TransferError`` naming the location.
- Everything else (headers, versions, checksums, zero-copy views) is the shared flow of ``base``.
"""
from __future__ import annotations

import itertools
import os
import weakref

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.base import BufferPublisher, BufferPuller, describe_chunks

_PUBLISHERS: "weakref.WeakValueDictionary[str, InProcessPublisher]" = weakref.WeakValueDictionary()
_COUNTER = itertools.count()


class InProcessPublisher(BufferPublisher):
    backend = "inprocess"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self.location = f"inprocess:{os.getpid()}:{next(_COUNTER)}"
        self.buffer: np.ndarray | None = None
        _PUBLISHERS[self.location] = self

    def _reserve(self, nbytes: int) -> np.ndarray:
        if self.buffer is None or len(self.buffer) < nbytes:
            self.buffer = np.empty(nbytes, dtype=np.uint8)
        return self.buffer

    def _release(self) -> None:
        _PUBLISHERS.pop(self.location, None)
        self.buffer = None


class InProcessPuller(BufferPuller):
    backend = "inprocess"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self._dst: np.ndarray | None = None

    def _reserve(self, nbytes: int) -> np.ndarray:
        if self._dst is None or len(self._dst) < nbytes:
            self._dst = np.empty(nbytes, dtype=np.uint8)
        return self._dst

    def _read(self, descriptor, dst, chunks) -> None:
        publisher = _PUBLISHERS.get(descriptor.location)
        src = None if publisher is None else publisher.buffer
        if src is None:
            raise TransferError(f"no in-process publisher at {descriptor.location} (closed, or in another "
                                f"process); failed read: {describe_chunks(descriptor, chunks)}")
        base = descriptor.address - int(src.ctypes.data)
        for offset, length in chunks:
            if base < 0 or base + offset + length > len(src):
                raise TransferError(f"address outside the published buffer ({len(src)} bytes at "
                                    f"{int(src.ctypes.data):#x}): {describe_chunks(descriptor, chunks)}")
            dst[offset:offset + length] = src[base + offset:base + offset + length]

    def _discard(self, dst) -> None:
        if dst is self._dst:
            self._dst = None

    def _release(self) -> None:
        self._dst = None
