"""Placeholder modules for SGLang 0.5.23 on a CPU-only machine (see README.md beside this file).

``install_stub(name)`` makes the already-imported module ``name`` a stub:
- any attribute (``sgl_kernel.scalar_type.scalar_types.uint4``) resolves to a placeholder class, so imports and
  attribute chains evaluated at import time succeed;
- calling or instantiating a placeholder raises ``NotImplementedError`` naming it, so code that would really need
  the missing CUDA build fails loudly instead of computing something wrong;
- any submodule (``import torchvision.transforms.functional``) imports, through a meta-path finder.
Dunder lookups (``__version__``, ``__path__`` of a plain attribute) raise AttributeError as for a real module.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _PlaceholderMeta(type):
    def __getattr__(cls, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return placeholder(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise NotImplementedError(f"{cls.__qualname__} is a CPU stub (scripts/sglang_cpu_stubs): the real CUDA "
                                  f"package is not installed on this machine")


def placeholder(qualname: str) -> type:
    """A class standing for ``qualname``: attributes resolve to placeholders, calling it raises."""
    cls = _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {})
    cls.__qualname__ = qualname
    return cls


def _module_getattr(module_name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        value = placeholder(f"{module_name}.{attr}")
        setattr(sys.modules[module_name], attr, value)
        return value
    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module) -> None:
        pass


def install_stub(name: str) -> None:
    module = sys.modules[name]
    module.__getattr__ = _module_getattr(name)
    if not any(isinstance(f, _StubFinder) and f.root == name for f in sys.meta_path):
        sys.meta_path.append(_StubFinder(name))
