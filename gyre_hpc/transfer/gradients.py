"""Gradients as tensors: a satellite publishes each group's gradients into a registered buffer, the core pulls them.

The road (issue 14, item 5) reuses the weight transfer (``base``: header, manifest, chunk checksums, the same
backends ``transfer.backend``), turned around: every satellite owns a ``GradientSender`` (a publisher) and the
core owns one ``GradientReceiver`` (a puller). Per group::

    satellite: grads (torch, fp32) ──copy──▶ slot s of its registered buffer ──▶ WeightDescriptor (small)
    satellite ──GRADS{version, gid, Z, loss, lag, ..., "grads": descriptor.to_dict()}──▶ core   (data plane, MPI)
    core:      GradLedger admits (version, gid)?  ── yes ──▶ pull slot s (checksums) ──▶ sum Z·g

The sender's buffer holds ``slots`` segments, each a 64-byte header and one contiguous data region laid out in the
model's fixed parameter order (64-byte aligned). A segment is bound to one group id for the policy version the
sender is on; the first gradient of a newer version frees every segment (the core takes gradients only of its
current version, and a satellite can hold version v + 1 only after the core stepped on v, so a gradient of an
older version is never pulled again). With ``slots = scheduler.batch_groups`` (the most distinct groups the hub
hands out per version) a satellite never overwrites a gradient the core may still pull, and never waits for an
acknowledgement.

Why not torch.distributed collectives: the core takes each group's gradients asynchronously, from whichever
satellites the allocator has in TRAIN at the moment, and drops copies (``dataplane.GradLedger``). A collective per
step needs every member of the group to enter it; a satellite that leaves mid-step (switched to rollout, hung,
killed) would block the reduce, and building a process group per membership is itself collective over the old
members. A pull is one-sided: a satellite that left makes one pull fail (a ``TransferError`` within
``transfer.timeout_s``, at once for a dead peer), the core drops that copy and the hub re-issues the group.

Invariants (tests/integration/test_grad_transfer.py, tests/integration/test_grad_exchange.py)
- What the core receives is bit-identical to what the satellite computed (float32, checksummed per chunk; a
  mismatch or a segment rewritten during the pull is a ``TransferError``, never a wrong gradient).
- The data-plane message carries the descriptor (names, offsets, checksums): no gradient array is pickled.
- A segment is rewritten only for the same group id of the same version, or after the sender moved to a newer
  version; more distinct groups in one version than ``slots`` is a ``TransferError`` (never a silent overwrite).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.base import HEADER_BYTES, WRITING, PullStats, WeightDescriptor, header_bytes
from gyre_hpc.transfer.manifest import ALIGNMENT, TensorEntry, make_manifest


def layout(shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[TensorEntry, ...], int]:
    """Float32 entries for every parameter in the model's order (64-byte aligned) and the data size."""
    entries, offset = [], 0
    for name, shape in shapes.items():
        offset = -(-offset // ALIGNMENT) * ALIGNMENT
        nbytes = int(np.prod(shape, dtype=np.int64)) * 4
        entries.append(TensorEntry(name, "<f4", tuple(int(d) for d in shape), offset, nbytes))
        offset += nbytes
    return tuple(entries), offset


def _copy_in(dst: np.ndarray, grad) -> None:
    """``grad`` (a torch tensor or a numpy array, float32) into the float32 view ``dst``, one copy."""
    if hasattr(grad, "detach"):
        import torch

        torch.from_numpy(dst).copy_(grad.detach().reshape(dst.shape))
    else:
        np.copyto(dst, np.asarray(grad).reshape(dst.shape), casting="no")


class GradientSender:
    """A satellite's gradient publisher: ``slots`` segments in one buffer registered once with the backend."""

    def __init__(self, cfg: TransferConfig, shapes: Mapping[str, tuple[int, ...]], slots: int):
        from gyre_hpc.transfer import make_publisher

        if slots < 1:
            raise TransferError(f"gradient sender: slots must be >= 1, got {slots}")
        self.cfg, self.slots = cfg, slots
        self.entries, self.data_bytes = layout(shapes)
        self._by_name = {e.name: e for e in self.entries}
        self.segment = -(-(HEADER_BYTES + self.data_bytes) // ALIGNMENT) * ALIGNMENT
        self.publisher = make_publisher(cfg)
        # one region, registered once; a segment's pages are touched (and cost memory) only once it is used
        self.buffer = self.publisher._reserve(slots * self.segment)  # noqa: SLF001 (same package)
        self.version: int | None = None
        self.slot_of: dict[int, int] = {}  # gid -> segment, for ``version``
        self.sequence = 0  # header version of each publish: strictly increasing, so a rewrite is seen as stale

    @property
    def backend(self) -> str:
        return self.publisher.backend

    def publish(self, grads: Mapping[str, object], version: int, gid: int) -> WeightDescriptor:
        """Write group ``gid``'s gradients of policy ``version`` into a segment; returns its descriptor. Only the
        parameters in ``grads`` travel (a parameter without a gradient stays absent, as in the core's own sum)."""
        self.publisher._check_usable()  # noqa: SLF001
        unknown = [n for n in grads if n not in self._by_name]
        if unknown:
            raise TransferError(f"gradients of parameters the model does not have: {unknown[:5]}")
        if self.version is None or version > self.version:
            self.version, self.slot_of = version, {}
        elif version < self.version:
            raise TransferError(f"gradients of version {version} after version {self.version}: the core takes "
                                f"only its current version")
        if gid not in self.slot_of:
            if len(self.slot_of) >= self.slots:
                raise TransferError(f"more than {self.slots} groups of version {version} at one satellite (held: "
                                    f"{sorted(self.slot_of)}); gradient slots must cover scheduler.batch_groups")
            self.slot_of[gid] = len(self.slot_of)
        start = self.slot_of[gid] * self.segment
        seg = self.buffer[start:start + self.segment]
        self.sequence += 1
        seg[:HEADER_BYTES] = header_bytes(WRITING, self.data_bytes)
        entries, offset = [], 0
        data = seg[HEADER_BYTES:]
        for entry in self.entries:  # packed in the model's order, whatever order ``grads`` has
            if entry.name in grads:
                offset = -(-offset // ALIGNMENT) * ALIGNMENT
                entries.append(TensorEntry(entry.name, "<f4", entry.shape, offset, entry.nbytes))
                offset += entry.nbytes
        for entry in entries:
            _copy_in(data[entry.offset:entry.offset + entry.nbytes].view("<f4").reshape(entry.shape),
                     grads[entry.name])
        manifest = make_manifest(entries, offset, data, self.sequence, self.cfg.checksum,
                                 self.cfg.checksum_chunk_bytes)
        seg[:HEADER_BYTES] = header_bytes(self.sequence, offset)
        return WeightDescriptor(self.backend, self.publisher.location, int(seg.ctypes.data), manifest)

    def close(self) -> None:
        self.buffer = None
        self.publisher.close()

    def __enter__(self) -> "GradientSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GradientReceiver:
    """The core's gradient puller: ``pull(descriptor dict)`` -> (float32 views, PullStats)."""

    def __init__(self, cfg: TransferConfig):
        from gyre_hpc.transfer import make_puller

        self.puller = make_puller(cfg)
        self.pulls: list[PullStats] = []

    def pull(self, descriptor: Mapping) -> tuple[dict[str, np.ndarray], PullStats]:
        """The gradients behind ``descriptor`` (views valid until the next pull); ``TransferError`` when the
        satellite is gone, the segment was rewritten, or a checksum does not match."""
        arrays, stats = self.puller.pull(WeightDescriptor.from_dict(descriptor))
        self.pulls.append(stats)
        return arrays, stats

    def close(self) -> None:
        self.puller.close()

    def __enter__(self) -> "GradientReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
