"""megatron-core's ``@jit_fuser`` functions are compiled when first called, not when megatron-core is imported.

megatron/core/jit.py sets ``jit_fuser = torch.compile`` when it is imported, and about forty functions are decorated
with it while ``megatron.core`` imports. Each ``torch.compile(fn)`` imports torch._dynamo and torch._inductor (with
sympy and networkx): about 1.4 CPU s of every process that builds a megatron model (each local engine, each cell
rank; benchmarks/results/test_cpu.md), although on the CPU, with the local layer spec, none of these functions is
ever called. ``install()`` (run by ``gyre_hpc.train``'s ``__init__``) puts a finder on ``sys.meta_path`` that, while
megatron/core/jit.py executes and only then, makes ``torch.compile`` the deferring ``compile_on_first_call``: a
decorated function calls ``torch.compile(fn, **kwargs)`` (the real one, same arguments) the first time it is
called, and from then on the compiled function.

Invariants
- Calling a decorated function gives what the object ``torch.compile(fn, **kwargs)`` gives; that object is built
  once, at the first call.
- ``torch.compile`` is the real function everywhere outside the execution of megatron/core/jit.py.
- ``install()`` is idempotent, and changes nothing once megatron.core.jit is imported; the finder removes itself
  at its first use.
- Standard library at import time (torch only inside the execution of megatron/core/jit.py, which imports it).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable

#: the module whose execution reads ``torch.compile`` into ``jit_fuser``
TARGET = "megatron.core.jit"


def compile_on_first_call(compile_fn: Callable[..., Any], model: Callable | None = None, **kwargs: Any):
    """``compile_fn(model, **kwargs)``, built when the result is first called (also as ``@deco(**kwargs)``)."""
    if model is None:
        return lambda fn: compile_on_first_call(compile_fn, fn, **kwargs)
    compiled: list[Callable] = []

    @functools.wraps(model)
    def call(*args: Any, **kw: Any) -> Any:
        if not compiled:
            compiled.append(compile_fn(model, **kwargs))
        return compiled[0](*args, **kw)

    return call


class _DeferCompile(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` with the normal path finder and executes it with ``torch.compile`` deferred."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def deferred(module) -> None:
            import torch

            real = torch.compile
            torch.compile = functools.partial(compile_on_first_call, real)
            try:
                exec_module(module)
            finally:
                torch.compile = real

        spec.loader.exec_module = deferred
        return spec


def install() -> None:
    """Defer megatron-core's ``jit_fuser`` compilation in this process (before megatron.core is imported)."""
    if TARGET in sys.modules or any(isinstance(f, _DeferCompile) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _DeferCompile())
