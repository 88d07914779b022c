"""Weight transfer over Mooncake Transfer Engine (``mooncake-transfer-engine-non-cuda``; TCP on CPU hosts).

Each publisher and puller owns one engine started in P2P-handshake mode (no metadata server) on
``transfer.host``; a publisher's ``location`` is ``"host:rpc_port"``, the Mooncake session name peers read
from. The publisher registers its buffer once and re-registers only when the weights grow (the previous
buffer stays allocated until the next growth or ``close``, so a read already in flight never touches freed
memory). The puller registers its destination the same way and reads with ``batch_transfer_sync_read``.

Invariants
- Mooncake reports every failure as ``-1`` (the reason goes to stderr only); each one becomes a
  ``TransferError`` naming the peer, the bytes and the chunk offsets, and the destination buffer is
  quarantined: a timed-out read can still land later, so it is never handed out or reused.
- ``protocol="rdma"`` with no RDMA device in Mooncake's own topology raises ``TransferError`` before the engine
  starts (Mooncake itself would fall back to TCP with only a log line).
- ``transfer.timeout_s`` bounds how long a read of a stalled peer blocks (it is written to
  ``MC_TRANSFER_TIMEOUT``, ``MC_TCP_PROGRESS_TIMEOUT_SEC`` and ``MC_TCP_STATUS_TIMEOUT_SEC``), and
  ``transfer.log_level`` to ``MC_LOG_LEVEL``, before the engine starts: the config wins over the environment.
- Engines are created in the constructor, so construct publishers and pullers after any fork (spawn).
- An engine's start-up noise on stderr (glog's "Logging before InitGoogleLogging" and "Local segment descriptor
  not found", logged at ERROR in P2P-handshake mode) is dropped unless ``--verbose`` (``gyre_hpc/launcher/quiet.py``);
  every other line, failures included, still reaches stderr.
"""
from __future__ import annotations

import json
import os

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.launcher.quiet import MOONCAKE_NOISE, native_stderr_filtered
from gyre_hpc.transfer.base import BufferPublisher, BufferPuller, describe_chunks


def rdma_devices(engine) -> list[str]:
    """RDMA devices (HCAs) in Mooncake's topology: ``{"cpu:0": [[preferred...], [available...]], ...}``."""
    topology = json.loads(engine.get_local_topology() or "{}")
    return sorted({hca for lists in topology.values() for hcas in lists for hca in hcas})


def timeout_environment(seconds: int) -> dict[str, str]:
    """Mooncake's stall timeouts. ``MC_TRANSFER_TIMEOUT`` alone is not enough: the TCP transport waits
    ``max(5, MC_TRANSFER_TIMEOUT)`` s unless its own progress and status timeouts are set too (measured)."""
    value = str(seconds)
    return {"MC_TRANSFER_TIMEOUT": value, "MC_TCP_PROGRESS_TIMEOUT_SEC": value, "MC_TCP_STATUS_TIMEOUT_SEC": value}


def start_engine(cfg: TransferConfig):
    """A Mooncake engine listening on ``cfg.host`` in P2P-handshake mode; any failure is a ``TransferError``."""
    os.environ.update(timeout_environment(cfg.timeout_s), MC_LOG_LEVEL=cfg.log_level)  # read at import
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise TransferError(f"transfer.backend=mooncake needs mooncake-transfer-engine-non-cuda and the "
                            f"libibverbs1 system package: {exc}") from None
    for attempt in range(_START_ATTEMPTS):
        with native_stderr_filtered(MOONCAKE_NOISE):  # its start-up lines are noise (gyre_hpc/launcher/quiet.py)
            engine = TransferEngine()
            if cfg.protocol == "rdma" and not rdma_devices(engine):
                raise TransferError("transfer.protocol=rdma but Mooncake finds no RDMA device on this host (it "
                                    "would silently fall back to TCP); use transfer.protocol=tcp or fix the RDMA "
                                    "install")
            rc = engine.initialize(cfg.host, "P2PHANDSHAKE", cfg.protocol, "")
        if rc != 0:
            raise TransferError(f"Mooncake engine failed to start on {cfg.host} ({cfg.protocol}), return code {rc}")
        if _listening(engine.get_rpc_port()):
            return engine
        del engine  # its handshake port was taken by another process between Mooncake's probe and its bind
    raise TransferError(f"Mooncake engine never listened on its handshake port ({_START_ATTEMPTS} attempts): "
                        "another process took each port it chose; retry or free ports in its range")


_START_ATTEMPTS = 5


def _listening(port: int) -> bool:
    """True if this process listens on TCP ``port``. Mooncake picks its handshake port by probing, then binds it
    later; a port taken meanwhile fails silently (its peers then reach nothing, or another program)."""
    import psutil

    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
               for c in psutil.Process().net_connections(kind="tcp"))


class _Registered:
    """A growable buffer registered with one engine.

    A publisher keeps its previous buffer allocated after growing (peers may be reading it); a puller keeps
    every quarantined buffer allocated until ``release`` (a failed read may still land in it)."""

    def __init__(self, engine, what: str, keep_previous: bool):
        self.engine, self.what, self.keep_previous = engine, what, keep_previous
        self.buffer: np.ndarray | None = None
        self.previous: np.ndarray | None = None
        self.quarantined: list[np.ndarray] = []

    def reserve(self, nbytes: int) -> np.ndarray:
        if self.buffer is not None and len(self.buffer) >= nbytes:
            return self.buffer
        fresh = np.empty(max(nbytes, 1), dtype=np.uint8)
        rc = self.engine.register_memory(int(fresh.ctypes.data), len(fresh))
        if rc != 0:
            raise TransferError(f"Mooncake could not register the {len(fresh)}-byte {self.what} buffer (rc {rc})")
        old, self.buffer = self._unregister(), fresh
        if self.keep_previous:
            self.previous = old
        return fresh

    def quarantine(self) -> None:
        """Unregister the current buffer and keep it allocated until ``release``."""
        old = self._unregister()
        if old is not None:
            self.quarantined.append(old)

    def release(self) -> list[np.ndarray]:
        """Unregister everything and drop the engine reference; returns every array, which the caller frees
        only after the engine itself is gone (its threads may still be reading or writing them)."""
        self.quarantine()
        arrays = self.quarantined + ([self.previous] if self.previous is not None else [])
        self.previous, self.quarantined, self.engine = None, [], None
        return arrays

    def _unregister(self) -> np.ndarray | None:
        old, self.buffer = self.buffer, None
        if old is not None:
            self.engine.unregister_memory(int(old.ctypes.data))
        return old


class MooncakePublisher(BufferPublisher):
    backend = "mooncake"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self.engine = start_engine(cfg)
        self.location = f"{cfg.host}:{self.engine.get_rpc_port()}"
        self._memory = _Registered(self.engine, "publisher", keep_previous=True)

    def _reserve(self, nbytes: int) -> np.ndarray:
        return self._memory.reserve(nbytes)

    def _release(self) -> None:
        arrays = self._memory.release()
        self._memory = self.engine = None  # the engine stops here: its destructor joins its threads
        del arrays  # only now free the memory those threads could touch


class MooncakePuller(BufferPuller):
    backend = "mooncake"

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self.engine = start_engine(cfg)
        self._memory = _Registered(self.engine, "puller", keep_previous=False)

    @property
    def quarantined(self) -> int:
        """Destination buffers set aside after failed reads (freed only at ``close``)."""
        return 0 if self._memory is None else len(self._memory.quarantined)

    def _reserve(self, nbytes: int) -> np.ndarray:
        return self._memory.reserve(nbytes)

    def _read(self, descriptor, dst, chunks) -> None:
        local, remote = int(dst.ctypes.data), descriptor.address
        rc = self.engine.batch_transfer_sync_read(
            descriptor.location,
            [local + off for off, _ in chunks], [remote + off for off, _ in chunks], [n for _, n in chunks],
        )
        if rc != 0:
            raise TransferError(f"Mooncake read failed (rc {rc}; reason on stderr): "
                                f"{describe_chunks(descriptor, chunks)}")

    def _discard(self, dst) -> None:
        if dst is self._memory.buffer:
            self._memory.quarantine()

    def _release(self) -> None:
        arrays = self._memory.release()
        self._memory = self.engine = None  # the engine stops here: its destructor joins its threads
        del arrays  # only now free the memory those threads could touch
