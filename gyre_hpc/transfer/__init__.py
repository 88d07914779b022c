"""Weight transfer: the core cell publishes its weights, satellites and engines pull them.

    from gyre_hpc.transfer import make_publisher, make_puller, WeightDescriptor

    publisher = make_publisher(cfg.transfer)          # in the core cell's process
    desc = publisher.publish({"w": w_np}, version=3)  # -> small descriptor; send desc.to_dict() over MPI
    puller = make_puller(cfg.transfer)                # in the satellite's process (create after any fork)
    weights, stats = puller.pull(WeightDescriptor.from_dict(msg))   # zero-copy views, PullStats

Backends (``transfer.backend``): ``mooncake`` (Mooncake Transfer Engine, TCP or RDMA), ``inprocess``
(memcpy, same process), ``socket`` (plain TCP, the benchmark baseline). Backend modules are imported only
when chosen, so the in-process stand-in never needs Mooncake. See docs/transfer.md.
"""
from __future__ import annotations

import importlib

from gyre_hpc.config import TransferConfig
from gyre_hpc.transfer.base import PullStats, WeightDescriptor, WeightPublisher, WeightPuller
from gyre_hpc.transfer.manifest import TensorEntry, WeightManifest, pack_weights, unpack_weights

_BACKENDS = {
    "mooncake": ("gyre_hpc.transfer.mooncake", "MooncakePublisher", "MooncakePuller"),
    "inprocess": ("gyre_hpc.transfer.inprocess", "InProcessPublisher", "InProcessPuller"),
    "socket": ("gyre_hpc.transfer.socket", "SocketPublisher", "SocketPuller"),
}

__all__ = ["make_publisher", "make_puller", "PullStats", "WeightDescriptor", "WeightPublisher", "WeightPuller",
           "TensorEntry", "WeightManifest", "pack_weights", "unpack_weights"]


def _backend(cfg: TransferConfig, index: int):
    module, *classes = _BACKENDS[cfg.backend]
    return getattr(importlib.import_module(module), classes[index])


def make_publisher(cfg: TransferConfig) -> WeightPublisher:
    """A publisher for ``cfg`` (a ``TransferConfig``), owned by the calling process."""
    return _backend(cfg, 0)(cfg)


def make_puller(cfg: TransferConfig) -> WeightPuller:
    """A puller for ``cfg`` (a ``TransferConfig``), owned by the calling process."""
    return _backend(cfg, 1)(cfg)
