"""Weight manifest: where each named array lies in one flat byte buffer, and the checksum of those bytes.

A dict of named numpy arrays is packed, in insertion order, into one ``uint8`` data region::

    names      embed.weight          pad   layers.0.bias  pad   head.weight
    offset     0                     ...   1048576        ...   1048640
               |<---- nbytes ---->|        |<- nbytes ->|       |<---- nbytes ---->|
    chunks     |<-- chunk 0 (checksum_chunk_bytes) -->|<-- chunk 1 -->|<- chunk 2 ->|

Invariants
- Every tensor starts at a multiple of ``ALIGNMENT`` (64 bytes), tensors appear in insertion order and never
  overlap, and ``total_bytes`` is the end of the last tensor (no trailing pad).
- ``nbytes == prod(shape) * itemsize`` for every entry; only bool / integer / float / complex dtypes travel.
- ``unpack_weights(*pack_weights(w))`` returns arrays equal to ``w`` (dtype, shape, values), and they are views
  into the buffer: unpacking copies nothing.
- The checksum covers exactly ``data[0:total_bytes]``, chunk by chunk (chunk ``i`` is bytes
  ``[i * chunk_bytes, min(total_bytes, (i + 1) * chunk_bytes))``); one changed byte changes the digest of the
  chunk that holds it, and ``bad_chunks`` names that chunk.
- A manifest survives ``to_dict`` → JSON → ``from_dict`` unchanged (digests are hex strings, so any JSON reader
  keeps them exact); ``from_dict`` rejects malformed input with ``TransferError`` naming the field.

Checksums: ``xxh3_64`` (the ``xxhash`` package, ~13 GB/s on one core here) or ``crc32`` (stdlib ``zlib``,
~3 GB/s). The manifest records the algorithm, so publisher and puller always agree.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gyre_hpc.errors import TransferError

ALIGNMENT = 64
CHECKSUMS = ("xxh3_64", "crc32")


def _hasher(algorithm: str):
    if algorithm == "crc32":
        return lambda view: zlib.crc32(view) & 0xFFFFFFFF
    if algorithm == "xxh3_64":
        try:
            import xxhash
        except ImportError:
            raise TransferError("checksum 'xxh3_64' needs the xxhash package (pip install xxhash)") from None
        return xxhash.xxh3_64_intdigest
    raise TransferError(f"unknown checksum algorithm {algorithm!r}; valid: {', '.join(CHECKSUMS)}")


def chunk_digests(data: np.ndarray, algorithm: str, chunk_bytes: int) -> tuple[str, ...]:
    """Hex digest of each ``chunk_bytes`` slice of the 1-D uint8 ``data`` (the last slice may be shorter)."""
    digest = _hasher(algorithm)
    view = memoryview(data)
    return tuple(f"{digest(view[s:s + chunk_bytes]):016x}" for s in range(0, len(data), chunk_bytes))


@dataclass(frozen=True)
class TensorEntry:
    """One array in the flat buffer."""

    name: str
    dtype: str  # numpy dtype string, byte order included: "<f4", "<i8", "|b1"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the data region, a multiple of ALIGNMENT
    nbytes: int


@dataclass(frozen=True)
class WeightManifest:
    """Everything a puller needs to check and unpack the bytes it read; small and JSON/pickle-able."""

    version: int
    tensors: tuple[TensorEntry, ...]
    total_bytes: int
    checksum_algorithm: str
    checksum_chunk_bytes: int
    chunk_checksums: tuple[str, ...]

    @property
    def checksum(self) -> str:
        """One digest for the whole buffer: the digest of the chunk digests (for logs and run summaries)."""
        joined = np.frombuffer("".join(self.chunk_checksums).encode(), dtype=np.uint8)
        return f"{_hasher(self.checksum_algorithm)(memoryview(joined)):016x}"

    def bad_chunks(self, data: np.ndarray) -> list[int]:
        """Indices of the chunks of ``data[:total_bytes]`` whose digest differs from the manifest."""
        got = chunk_digests(data[: self.total_bytes], self.checksum_algorithm, self.checksum_chunk_bytes)
        return [i for i, (a, b) in enumerate(zip(got, self.chunk_checksums)) if a != b]

    def tensors_in(self, chunk: int) -> list[str]:
        """Names of the tensors that overlap chunk ``chunk`` (to say what a corrupt chunk damaged)."""
        lo, hi = chunk * self.checksum_chunk_bytes, (chunk + 1) * self.checksum_chunk_bytes
        return [t.name for t in self.tensors if t.offset < hi and t.offset + t.nbytes > lo]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WeightManifest":
        """Rebuild and validate a manifest; any defect is a ``TransferError`` naming ``manifest.<field>``."""
        return _parse_manifest(data)


def plan_layout(weights: Mapping[str, np.ndarray]) -> tuple[tuple[TensorEntry, ...], int]:
    """Entries (aligned offsets, insertion order) and the data size for ``weights``."""
    return plan_specs((name, np.asarray(a).dtype, np.shape(a)) for name, a in weights.items())


def plan_specs(specs) -> tuple[tuple[TensorEntry, ...], int]:
    """``plan_layout`` from ``(name, dtype, shape)`` triples alone: a layout planned before any array exists
    (a publisher filled bucket by bucket)."""
    entries, offset = [], 0
    for name, dtype, shape in specs:
        if not isinstance(name, str) or not name:
            raise TransferError(f"weight names must be non-empty strings, got {name!r}")
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        if dtype.kind not in "biufc":
            raise TransferError(f"weight {name!r}: dtype {dtype} cannot travel (bool/int/float/complex only)")
        offset = -(-offset // ALIGNMENT) * ALIGNMENT
        nbytes = math.prod(shape) * dtype.itemsize
        entries.append(TensorEntry(name, dtype.str, shape, offset, nbytes))
        offset += nbytes
    return tuple(entries), offset


def pack_into(weights: Mapping[str, np.ndarray], entries: tuple[TensorEntry, ...], data: np.ndarray) -> None:
    """Copy each array into its slot of the uint8 ``data`` region (padding is zeroed)."""
    end = 0
    for entry in entries:
        data[end:entry.offset] = 0
        np.copyto(_view(data, entry), weights[entry.name], casting="no")
        end = entry.offset + entry.nbytes


def make_manifest(entries, total_bytes, data, version, algorithm="xxh3_64", chunk_bytes=4 << 20) -> WeightManifest:
    """The manifest of packed ``data``: the layout plus the chunk checksums of ``data[:total_bytes]``."""
    if chunk_bytes < 1:
        raise TransferError(f"checksum chunk_bytes must be >= 1, got {chunk_bytes}")
    digests = chunk_digests(data[:total_bytes], algorithm, chunk_bytes)
    return WeightManifest(version, tuple(entries), total_bytes, algorithm, chunk_bytes, digests)


def pack_weights(weights: Mapping[str, np.ndarray], version: int = 0, algorithm: str = "xxh3_64",
                 chunk_bytes: int = 4 << 20) -> tuple[np.ndarray, WeightManifest]:
    """Pack ``weights`` into a fresh flat uint8 buffer and describe it."""
    entries, total = plan_layout(weights)
    data = np.empty(total, dtype=np.uint8)
    pack_into(weights, entries, data)
    return data, make_manifest(entries, total, data, version, algorithm, chunk_bytes)


def unpack_weights(data: np.ndarray, manifest: WeightManifest) -> dict[str, np.ndarray]:
    """Zero-copy views of each tensor in the uint8 ``data`` region (valid while ``data`` is)."""
    if data.dtype != np.uint8 or data.ndim != 1 or len(data) < manifest.total_bytes:
        raise TransferError(f"unpack needs a 1-D uint8 buffer of >= {manifest.total_bytes} bytes, "
                            f"got {data.dtype} {data.shape}")
    return {entry.name: _view(data, entry) for entry in manifest.tensors}


def _view(data: np.ndarray, entry: TensorEntry) -> np.ndarray:
    raw = data[entry.offset: entry.offset + entry.nbytes]
    return raw.view(np.dtype(entry.dtype)).reshape(entry.shape)


# ------------------------------------------------------------------------------------------- validation
def _field(data: Mapping, key: str, kind: type, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise TransferError(f"{where}.{key}: missing")
    value = data[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        name = "list" if kind == (list, tuple) else kind.__name__
        raise TransferError(f"{where}.{key}: expected {name}, got {value!r}")
    return value


def _parse_entry(data: Mapping, where: str) -> TensorEntry:
    name = _field(data, "name", str, where)
    dtype_str = _field(data, "dtype", str, where)
    try:
        dtype = np.dtype(dtype_str)
    except TypeError:
        raise TransferError(f"{where}.dtype: {dtype_str!r} is not a numpy dtype") from None
    shape = tuple(_field(data, "shape", (list, tuple), where))
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TransferError(f"{where}.shape: expected non-negative integers, got {shape!r}")
    offset, nbytes = _field(data, "offset", int, where), _field(data, "nbytes", int, where)
    if offset < 0 or offset % ALIGNMENT:
        raise TransferError(f"{where}.offset: {offset} is not a non-negative multiple of {ALIGNMENT}")
    if dtype.kind not in "biufc" or nbytes != math.prod(shape) * dtype.itemsize:
        raise TransferError(f"{where}.nbytes: {nbytes} does not match dtype {dtype_str} and shape {shape}")
    return TensorEntry(name, dtype_str, shape, offset, nbytes)


def _parse_manifest(data: Mapping[str, Any]) -> WeightManifest:
    w = "manifest"
    version, total = _field(data, "version", int, w), _field(data, "total_bytes", int, w)
    algorithm, chunk = _field(data, "checksum_algorithm", str, w), _field(data, "checksum_chunk_bytes", int, w)
    if algorithm not in CHECKSUMS:
        raise TransferError(f"{w}.checksum_algorithm: {algorithm!r} is not one of {', '.join(CHECKSUMS)}")
    if version < 0 or total < 0 or chunk < 1:
        raise TransferError(f"{w}: version, total_bytes must be >= 0 and checksum_chunk_bytes >= 1")
    tensors = tuple(_parse_entry(t, f"{w}.tensors[{i}]") for i, t in enumerate(_field(data, "tensors", (list, tuple), w)))
    end = 0
    for i, t in enumerate(tensors):
        if t.offset < end:
            raise TransferError(f"{w}.tensors[{i}].offset: {t.offset} overlaps the previous tensor (ends at {end})")
        end = t.offset + t.nbytes
    if end != total:
        raise TransferError(f"{w}.total_bytes: {total} but the last tensor ends at {end}")
    sums = tuple(_field(data, "chunk_checksums", (list, tuple), w))
    if len(sums) != -(-total // chunk) or not all(isinstance(s, str) and len(s) == 16 for s in sums):
        raise TransferError(f"{w}.chunk_checksums: expected {-(-total // chunk)} 16-digit hex strings")
    if len({t.name for t in tensors}) != len(tensors):
        raise TransferError(f"{w}.tensors: duplicate tensor names")
    return WeightManifest(version, tensors, total, algorithm, chunk, sums)
