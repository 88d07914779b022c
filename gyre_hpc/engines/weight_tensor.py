"""Weights into a running engine over ``/update_weights_from_tensor``: the tensor road (sender and engine on one host).

Who sends which bytes, when (docs/weights.md)::

    cell rank (the sender)                                     engine (the local engine or SGLang, same host)
    -- every new version -----------------------------------------------------------------------------------
    POST /pause_generation {mode: in_place}
    POST /begin_weight_update
    serialize [(name, tensor), ...] as SGLang's MultiprocessingSerializer does (ForkingPickler), with torch's
      "file_system" sharing: each CPU storage is moved into a shared-memory file (/dev/shm, one copy) and the
      pickle holds only its name, size and the tensor's shape/stride/dtype (a few hundred bytes per tensor)
    POST /update_weights_from_tensor {serialized_named_tensors: [base64(pickle)] (one per TP rank),
                                      weight_version, flush_cache, abort_all_requests: false}
                                                        ─▶  unpickles (only torch's tensor/storage rebuilders),
                                                            maps the shared files, loads the tensors (one copy),
                                                            answers once loaded
    POST /update_weight_version {new_version, abort_all_requests: false}
    POST /end_weight_update
    POST /continue_generation
    the sender drops its tensors: the shared files go when neither side holds them

Why "file_system" and not torch's default "file_descriptor": a file descriptor is handed over by
``multiprocessing.resource_sharer``, which authenticates with the *sender's* process-tree key; an SGLang scheduler
(or a local engine) started by another process tree cannot fetch it (``AuthenticationError``). A file name needs
no handshake. The strategy is process-wide in torch, so ``serialize`` sets it only while it pickles (under a lock)
and restores it.

Invariants
- The same bytes work for SGLang 0.5.23 (its ``SafeUnpickler`` allows every global this pickle names) and for the
  local engine (``deserialize`` allows only torch's tensor/storage rebuilders, dtypes and containers).
- An update is always closed (``/end_weight_update`` after a successful ``/begin_weight_update``,
  ``/continue_generation`` after ``/pause_generation``) and never aborts: the version is tagged with
  ``abort_all_requests: false``.
- Serializing moves the caller's CPU tensors into shared memory in place (torch's ``share_memory_``): pass
  tensors the caller owns (a pull's), not a model's parameters.
- The sender holds its tensors until the engine answered, so the shared files exist while the engine maps them.
  A refused update leaves the files until the sender's process ends (torch's shared-memory manager unlinks what
  a dead client created); nothing else can leak them.
- After ``1 + retries`` failed attempts the push raises ``WeightSyncError``.
"""
from __future__ import annotations

import base64
import io
import pickle
import threading
from typing import TYPE_CHECKING, Mapping

import torch

from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.engines.weight_sync import WeightSyncError, _quietly
from gyre_hpc.errors import EngineError

if TYPE_CHECKING:
    from gyre_hpc.config import EngineConfig

_STRATEGY = threading.Lock()
_REBUILDERS = ("rebuild_tensor", "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_typed_storage",
               "rebuild_typed_storage_child")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")
ALLOWED = ({("torch.multiprocessing.reductions", n) for n in _REBUILDERS}
           | {("torch", d) for d in DTYPES}
           | {("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage"), ("torch.storage", "TypedStorage"),
              ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"), ("torch", "Size"),
              ("builtins", "list"), ("builtins", "tuple"), ("collections", "OrderedDict")})


def serialize(named: list[tuple[str, torch.Tensor]]) -> bytes:
    """SGLang's ``MultiprocessingSerializer.serialize(named)`` bytes, CPU storages shared by file name."""
    import torch.multiprocessing as tmp  # registers torch's reducers with ForkingPickler
    from multiprocessing.reduction import ForkingPickler

    buf = io.BytesIO()
    with _STRATEGY:
        old = tmp.get_sharing_strategy()
        tmp.set_sharing_strategy("file_system")
        try:
            ForkingPickler(buf).dump(named)
        finally:
            tmp.set_sharing_strategy(old)
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a serialized tensor list")
        return super().find_class(module, name)


def deserialize(data: bytes) -> list[tuple[str, torch.Tensor]]:
    """The engine's side: ``[(name, tensor), ...]`` from ``serialize``'s bytes (or SGLang's, for CPU tensors)."""
    import torch.multiprocessing  # noqa: F401  (the rebuilders' module)

    try:
        named = _Unpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, TypeError) as exc:
        raise EngineError(f"serialized_named_tensors: {exc}", status=400) from None
    if not isinstance(named, (list, tuple)) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
            for p in named):
        raise EngineError("serialized_named_tensors: expected a list of (name, tensor) pairs", status=400)
    return list(named)


def make_pusher(engine_cfg: EngineConfig, client, timeout_s: float = 60.0, clock: Clock | None = None,
                group_name: str | None = None):
    """The pusher ``engine.weight_road`` names for ``client``'s engine (a ``WeightPusher`` or a ``TensorPusher``),
    for an engine of ``engine.tp`` ranks; ``group_name``: the weight group's (default ``weight_sync.GROUP_NAME``),
    one per engine a process pushes into (engine replicas)."""
    from gyre_hpc.engines.weight_sync import GROUP_NAME, WeightPusher, group_backend

    if engine_cfg.weight_road == "tensor":
        return TensorPusher(client, tp_size=engine_cfg.tp, clock=clock)
    return WeightPusher(client, host=engine_cfg.host, backend=group_backend(engine_cfg.device), timeout_s=timeout_s,
                        clock=clock, group_name=group_name or GROUP_NAME, engine_ranks=engine_cfg.tp)


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class TensorPusher:
    """Pushes versions into one engine on this host (``client``: an ``EngineClient``); ``tp_size``: payloads sent
    (SGLang reads the one of its TP rank)."""

    def __init__(self, client, retries: int = 2, tp_size: int = 1, clock: Clock | None = None):
        self.client, self.retries, self.tp_size = client, retries, tp_size
        self.clock = clock or WallClock()  # push timings
        self.attempts: list[dict] = []  # failed attempts (version, error)

    def connect(self) -> None:
        """Nothing to build (no group): the tensor road needs only HTTP and shared memory."""

    def push(self, tensors: Mapping[str, torch.Tensor], version: str, flush_cache: bool = False) -> dict:
        """Send ``tensors`` (engine names) as ``version``; returns {seconds, bytes, gb_per_s, tensors, attempt}."""
        errors = []
        for attempt in range(1 + self.retries):
            try:
                return {**self._push_once(tensors, str(version), flush_cache), "attempt": attempt}
            except (EngineError, RuntimeError) as exc:
                errors.append(f"attempt {attempt}: {exc}")
                self.attempts.append({"version": str(version), "error": str(exc)[:300]})
        raise WeightSyncError(f"{self.client.url}: weight version {version} not pushed after {1 + self.retries} "
                              "attempts: " + " | ".join(errors), endpoint="/update_weights_from_tensor")

    def _push_once(self, tensors: Mapping[str, torch.Tensor], version: str, flush_cache: bool) -> dict:
        t0 = self.clock.now()
        named = [(n, t.detach().cpu().contiguous()) for n, t in tensors.items()]
        payloads = [encode(serialize(named)) for _ in range(self.tp_size)]
        self.client.pause("in_place")
        try:
            self.client.begin_weight_update()
            try:
                self.client.update_weights_from_tensor(payloads, version, flush_cache)
                self.client.update_weight_version(version, abort_all_requests=False)
            finally:
                _quietly(self.client.end_weight_update)
        finally:
            self.client.resume()
        seconds = self.clock.now() - t0
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        del named  # the shared files go once the engine dropped its mappings too
        return {"seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / max(seconds, 1e-9) / 1e9,
                "tensors": len(tensors)}

    def reset(self, remote: bool = True) -> None:
        """Nothing to tear down (``WeightPusher``'s interface)."""

    def close(self) -> None:
        pass
