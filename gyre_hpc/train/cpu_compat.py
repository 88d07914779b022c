"""Run megatron-core 0.16.1 on a machine without CUDA (see shared/notes/megatron-cpu.md).

megatron-core hard-codes CUDA in a few run-time paths that no config flag avoids. ``apply()`` redirects exactly
those, and only when ``torch.cuda.is_available()`` is false:

- ``torch.cuda.current_device()`` returns ``torch.device("cpu")`` and ``torch.cuda.synchronize()`` does nothing
  (every ``device=torch.cuda.current_device()`` allocation then lands on the CPU: RoPE ``inv_freq``, buffers);
- the global memory buffer of ``parallel_state`` (used by every attention forward) allocates on the CPU;
- the CUDA RNG states tracker (dropout is wrapped in ``fork()`` even at p=0) is replaced by a tracker with the
  same API (``add/fork/get_states/set_states/reset``) over CPU generator states;
- ``get_default_causal_mask`` (used when no mask is passed) builds its mask on the CPU.

Invariants
- ``apply()`` is idempotent and a no-op when CUDA is available (it returns False then).
- It touches private names of the pinned megatron-core version (``PINNED``); ``check()`` raises ``RuntimeError``
  naming the first missing one, so an upgrade fails loudly in the test rather than silently at run time.
- ``CpuRNGStatesTracker.fork(name)`` runs its body on ``name``'s stream and restores the caller's CPU RNG state:
  two forks of the same name continue one stream, and code outside a fork sees no change.
"""
from __future__ import annotations

import contextlib
import functools
import importlib

import torch

PINNED = "0.16.1"

#: (module, attribute) pairs this module replaces or relies on.
PRIVATE_NAMES = (
    ("megatron.core.utils", "GlobalMemoryBuffer"),
    ("megatron.core.parallel_state", "_GLOBAL_MEMORY_BUFFER"),
    ("megatron.core.tensor_parallel.random", "_CUDA_RNG_STATE_TRACKER"),
    ("megatron.core.tensor_parallel.random", "_CUDA_RNG_STATE_TRACKER_INITIALIZED"),
    ("megatron.core.tensor_parallel.random", "CudaRNGStatesTracker"),
    ("megatron.core.transformer.utils", "get_default_causal_mask"),
    ("megatron.core.fusions.fused_softmax", "get_default_causal_mask"),
)

_applied = False


def check() -> None:
    """Raise ``RuntimeError`` unless megatron-core is the pinned version with every private name we touch."""
    import megatron.core

    version = getattr(megatron.core, "__version__", None)
    if version != PINNED:
        raise RuntimeError(f"gyre_hpc.train.cpu_compat is written for megatron-core {PINNED}, found {version}")
    for module, name in PRIVATE_NAMES:
        if not hasattr(importlib.import_module(module), name):
            raise RuntimeError(f"megatron-core {version}: {module}.{name} is gone; cpu_compat needs updating")


class CpuRNGStatesTracker:
    """Megatron's ``CudaRNGStatesTracker`` API over CPU generator states (named, independently seeded streams)."""

    def __init__(self, *args, **kwargs):
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def _cpu_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    required = functools.reduce(lambda a, b: a * b, tensor_shape, 1)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < required:
        buf = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu")
    return buf[:required].view(*tensor_shape)


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def apply() -> bool:
    """Patch megatron-core for CPU; returns True when the patches are (or already were) in place."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    check()
    from megatron.core import utils as mutils
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import utils as tutils

    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda device=None: None
    mutils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    tutils.get_default_causal_mask = _cpu_causal_mask
    fused_softmax.get_default_causal_mask = _cpu_causal_mask
    _applied = True
    return True
