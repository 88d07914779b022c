"""Weight publishing and pulling, independent of the wire: descriptors, the buffer header, and the pull flow.

A publisher owns one long-lived buffer (registered once with its transport, re-registered only when the
weights grow) laid out as a 64-byte header followed by the packed data region (see ``manifest``)::

    address -> | magic "GYREWTS1" | version (int64, -1 while rewriting) | data bytes | pad | data region ... |
               |<------------------------------- HEADER_BYTES = 64 -------------->|

``publish(weights, version)`` marks the header ``-1``, packs the weights, checksums them, writes ``version``
into the header and returns a ``WeightDescriptor``: a small frozen object (``to_dict`` is plain JSON) that
travels to pullers over any control channel (MPI, HTTP). ``pull(descriptor)`` reads the data region in
chunks, then the header, then verifies the chunk checksums, and returns zero-copy views into the puller's
own buffer plus ``PullStats``.

Invariants
- A pull returns only bytes whose chunk checksums match the manifest and whose header, read *after* the data,
  still carries the descriptor's version; anything else raises ``TransferError`` (a newer publish in between
  is reported as stale, never returned as a mix of versions).
- Published versions strictly increase per publisher; an older or equal version is a ``TransferError``.
- After a failed read the puller never reuses that destination buffer (a timed-out transfer may still land
  in it later); it allocates a fresh one for the next pull.
- The arrays a pull returns are views into the puller's buffer: valid until the next ``pull`` or ``close``.
- Publishers and pullers belong to the process that created them: use after a fork is a ``TransferError``
  (create them in spawned processes).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.manifest import (WeightManifest, make_manifest, pack_into, plan_layout, plan_specs,
                                        unpack_weights)

HEADER_BYTES = 64
MAGIC = int.from_bytes(b"GYREWTS1", "little")
WRITING = -1


@dataclass(frozen=True)
class WeightDescriptor:
    """Where version ``manifest.version`` can be read: ``backend``, the publisher's ``location`` (Mooncake and
    socket: ``"host:port"``; in-process: a registry key) and the ``address`` of its header there."""

    backend: str
    location: str
    address: int
    manifest: WeightManifest

    @property
    def version(self) -> int:
        return self.manifest.version

    def to_dict(self) -> dict:
        return {"backend": self.backend, "location": self.location, "address": self.address,
                "manifest": self.manifest.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WeightDescriptor":
        if not isinstance(data, Mapping) or set(data) != {"backend", "location", "address", "manifest"}:
            raise TransferError(f"descriptor: expected keys backend, location, address, manifest; got {data!r:.200}")
        if not isinstance(data["address"], int) or data["address"] < 0:
            raise TransferError(f"descriptor.address: expected a non-negative integer, got {data['address']!r}")
        return cls(str(data["backend"]), str(data["location"]), data["address"],
                   WeightManifest.from_dict(data["manifest"]))


@dataclass(frozen=True)
class PullStats:
    """What one pull moved: ``seconds`` is wire time (data + header reads), ``verify_seconds`` the checksum."""

    backend: str
    version: int
    bytes: int
    seconds: float
    gb_per_s: float  # 1e9 bytes per second over ``seconds``
    verify_seconds: float
    checksum_ok: bool | None  # None when verification is off (transfer.verify=false)
    checksum: str  # the manifest's whole-buffer digest

    def as_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class WeightPublisher(Protocol):
    def publish(self, weights: Mapping[str, np.ndarray], version: int) -> WeightDescriptor: ...
    def close(self) -> None: ...


@runtime_checkable
class WeightPuller(Protocol):
    def pull(self, descriptor: WeightDescriptor) -> tuple[dict[str, np.ndarray], PullStats]: ...
    def close(self) -> None: ...


def header_bytes(version: int, data_bytes: int) -> np.ndarray:
    return np.array([MAGIC, version, data_bytes, 0, 0, 0, 0, 0], dtype="<i8").view(np.uint8)


def read_header(raw: np.ndarray) -> tuple[int, int, int]:
    """(magic, version, data_bytes) from the first 64 bytes of ``raw``."""
    words = raw[:HEADER_BYTES].view("<i8")
    return int(words[0]), int(words[1]), int(words[2])


def plan_chunks(total: int, chunk_bytes: int, batch_bytes: int) -> list[list[tuple[int, int]]]:
    """Batches of (offset, length) chunks covering ``[0, total)``: each chunk <= ``chunk_bytes``, each batch
    <= ``max(chunk_bytes, batch_bytes)`` bytes; together they cover every byte exactly once, in order."""
    chunks = [(s, min(chunk_bytes, total - s)) for s in range(0, total, chunk_bytes)]
    per_batch = max(1, batch_bytes // chunk_bytes)
    return [chunks[i:i + per_batch] for i in range(0, len(chunks), per_batch)]


class _Owned:
    """Process ownership and closing, shared by publishers and pullers."""

    backend = "?"

    def __init__(self, cfg: TransferConfig):
        self.cfg = cfg
        self.clock: Clock = WallClock()  # the pulls' wire and verify seconds (a test may set another)
        self._pid = os.getpid()
        self._closed = False

    def _check_usable(self) -> None:
        if self._closed:
            raise TransferError(f"{self.backend} {type(self).__name__} is closed")
        if os.getpid() != self._pid:
            raise TransferError(f"{self.backend} {type(self).__name__} was created in process {self._pid} and "
                                f"used in {os.getpid()} after a fork; create it in a spawned process")

    def close(self) -> None:
        if not self._closed and os.getpid() == self._pid:
            self._release()
        self._closed = True

    def _release(self) -> None:
        """Backend hook: free transport resources."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BufferPublisher(_Owned):
    """Packs weights into one reusable buffer; backends make it readable (``_reserve``) and say where."""

    location = ""

    def __init__(self, cfg: TransferConfig):
        super().__init__(cfg)
        self._version: int | None = None
        self._published: tuple[list, np.ndarray] | None = None  # (entries, data) of the last version published

    def publish(self, weights: Mapping[str, np.ndarray], version: int) -> WeightDescriptor:
        self._check_usable()
        self._check_version(version)
        entries, total = plan_layout(weights)
        buf = self._reserve(HEADER_BYTES + total)
        buf[:HEADER_BYTES] = header_bytes(WRITING, total)
        data = buf[HEADER_BYTES:HEADER_BYTES + total]
        pack_into(weights, entries, data)
        return self._done(entries, total, data, buf, version)

    def publish_stream(self, specs, buckets, version: int) -> WeightDescriptor:
        """``publish`` filled bucket by bucket: ``specs`` ``(name, dtype, shape)`` plan the layout up front, then
        each bucket (a mapping of some of those names to arrays) is copied into its slots as it comes, so the
        caller never holds more than one bucket besides this buffer. Every planned name must arrive exactly once;
        otherwise the header stays "rewriting" (no puller takes it) and a ``TransferError`` names what is wrong."""
        self._check_usable()
        self._check_version(version)
        entries, total = plan_specs(specs)
        slots = {e.name: e for e in entries}
        buf = self._reserve(HEADER_BYTES + total)
        buf[:HEADER_BYTES] = header_bytes(WRITING, total)
        data = buf[HEADER_BYTES:HEADER_BYTES + total]
        data[:] = 0  # the padding between slots
        filled: set[str] = set()
        for bucket in buckets:
            for name, array in bucket.items():
                if name not in slots or name in filled:
                    why = "not planned" if name not in slots else "sent twice"
                    raise TransferError(f"publish_stream: {name!r} is {why}")
                e = slots[name]
                np.copyto(data[e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype)).reshape(e.shape), array,
                          casting="no")
                filled.add(name)
        if len(filled) != len(slots):
            missing = [n for n in slots if n not in filled]
            raise TransferError(f"publish_stream: {len(missing)} planned tensors never came: {missing[:5]}")
        return self._done(entries, total, data, buf, version)

    def _done(self, entries: list, total: int, data: np.ndarray, buf: np.ndarray, version: int) -> WeightDescriptor:
        manifest = make_manifest(entries, total, data, version, self.cfg.checksum, self.cfg.checksum_chunk_bytes)
        buf[:HEADER_BYTES] = header_bytes(version, total)
        self._version = version
        self._published = (entries, data)
        return WeightDescriptor(self.backend, self.location, int(buf.ctypes.data), manifest)

    def published(self) -> dict[str, np.ndarray]:
        """The tensors of the last version published, as views into the buffer (no copy; never to be written): what
        a writer of the same version to disk reads, until the next ``publish`` overwrites them."""
        self._check_usable()
        if self._published is None:
            raise TransferError("published: nothing published yet")
        entries, data = self._published
        out = {}
        for e in entries:
            out[e.name] = data[e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype)).reshape(e.shape)
        return out

    def _check_version(self, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise TransferError(f"publish: version must be a non-negative integer, got {version!r}")
        if self._version is not None and version <= self._version:
            raise TransferError(f"publish: version must increase, got {version} after {self._version}")

    def _reserve(self, nbytes: int) -> np.ndarray:
        """Backend hook: a readable uint8 buffer of at least ``nbytes`` (the same one while it is big enough)."""
        raise NotImplementedError


class BufferPuller(_Owned):
    """The pull flow shared by every backend; backends supply ``_reserve``, ``_read`` and ``_discard``."""

    def pull(self, descriptor: WeightDescriptor) -> tuple[dict[str, np.ndarray], PullStats]:
        self._check_usable()
        if descriptor.backend != self.backend:
            raise TransferError(f"a {self.backend} puller cannot read a {descriptor.backend} descriptor "
                                f"({descriptor.location})")
        manifest = descriptor.manifest
        dst = self._reserve(HEADER_BYTES + manifest.total_bytes)
        start = self.clock.now()
        try:
            for batch in plan_chunks(manifest.total_bytes, self.cfg.chunk_bytes, self.cfg.batch_bytes):
                self._read(descriptor, dst, [(HEADER_BYTES + off, n) for off, n in batch])
            self._read(descriptor, dst, [(0, HEADER_BYTES)])
        except TransferError:
            self._discard(dst)
            raise
        seconds = self.clock.now() - start
        self._check_header(descriptor, dst)
        data = dst[HEADER_BYTES:HEADER_BYTES + manifest.total_bytes]
        checksum_ok, verify_start = None, self.clock.now()
        if self.cfg.verify:
            self._verify(descriptor, data)
            checksum_ok = True
        nbytes = HEADER_BYTES + manifest.total_bytes
        stats = PullStats(self.backend, manifest.version, nbytes, seconds, nbytes / max(seconds, 1e-9) / 1e9,
                          self.clock.now() - verify_start, checksum_ok, manifest.checksum)
        return unpack_weights(data, manifest), stats

    @staticmethod
    def _check_header(descriptor: WeightDescriptor, dst: np.ndarray) -> None:
        magic, version, data_bytes = read_header(dst)
        where = f"{descriptor.backend} publisher {descriptor.location} at {descriptor.address:#x}"
        if magic != MAGIC:
            raise TransferError(f"{where} holds no gyre weight buffer (magic {magic:#x})")
        if version != descriptor.version or data_bytes != descriptor.manifest.total_bytes:
            state = "is rewriting its buffer" if version == WRITING else f"now serves version {version}"
            raise TransferError(f"stale descriptor: {where} {state}; the descriptor is for version "
                                f"{descriptor.version}; pull the newer descriptor")

    @staticmethod
    def _verify(descriptor: WeightDescriptor, data: np.ndarray) -> None:
        manifest = descriptor.manifest
        bad = manifest.bad_chunks(data)
        if bad:
            names = sorted({n for c in bad for n in manifest.tensors_in(c)})
            raise TransferError(f"checksum mismatch in {len(bad)} of {len(manifest.chunk_checksums)} chunks "
                                f"(first: chunk {bad[0]}) of version {manifest.version} from "
                                f"{descriptor.location}; damaged tensors: {', '.join(names[:5])}"
                                f"{' ...' if len(names) > 5 else ''}")

    def _reserve(self, nbytes: int) -> np.ndarray:
        """Backend hook: a destination uint8 buffer of at least ``nbytes`` (reused across pulls)."""
        raise NotImplementedError

    def _read(self, descriptor: WeightDescriptor, dst: np.ndarray, chunks: list[tuple[int, int]]) -> None:
        """Backend hook: copy each (offset, length) of the publisher's region at ``descriptor.address`` into
        ``dst`` at the same offset; raise ``TransferError`` naming peer, bytes and chunks on failure."""
        raise NotImplementedError

    def _discard(self, dst: np.ndarray) -> None:
        """Backend hook: ``dst`` saw a failed read; never hand it out again."""
        raise NotImplementedError


def describe_chunks(descriptor: WeightDescriptor, chunks: list[tuple[int, int]]) -> str:
    """'<n> bytes [lo, hi) of version v from location' for error messages."""
    lo, hi = chunks[0][0], chunks[-1][0] + chunks[-1][1]
    return (f"{sum(n for _, n in chunks)} bytes in {len(chunks)} chunk(s) at offsets [{lo}, {hi}) of version "
            f"{descriptor.version} from {descriptor.location} (address {descriptor.address:#x})")
