"""The weights directory an engine loads with ``/update_weights_from_disk`` (written from ``Trainer.export_weights``).

Layout (format ``gyre-weights-v1``)::

    <dir>/weights.pt     torch.save of the flat {name: CPU tensor} (the tensor entries of GPTModel.state_dict(),
                         full, un-sharded: what ``Trainer.export_weights()`` returns); loaded with weights_only=True
    <dir>/meta.json      {"format", "weight_version", "checksum", "tensors": {name: [dtype, shape]}}

Names and layouts are megatron-core's own, so weights move from trainer to engine without conversion.

Invariants
- A reader never sees a partial directory: ``save_weights`` writes through ``gyre_hpc.files.io.atomic_dir``.
- ``weights_checksum`` is a function of names, dtypes, shapes and bytes only (order of the mapping does not
  matter); ``load_weights_dir`` recomputes it and refuses (``EngineError``) a directory whose tensors do not match
  the checksum its meta.json records, so corrupt or mixed files are never loaded.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

import torch

from gyre_hpc.errors import EngineError
from gyre_hpc.files.io import atomic_dir

FORMAT = "gyre-weights-v1"


def weights_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_weights(path: str | Path, state: Mapping[str, torch.Tensor], weight_version: str) -> Path:
    """Write ``state`` (flat name → tensor) and its meta atomically to the directory ``path``."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}
    meta = {
        "format": FORMAT,
        "weight_version": str(weight_version),
        "checksum": weights_checksum(state),
        "tensors": {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in sorted(state.items())},
    }
    with atomic_dir(path) as tmp:
        torch.save(state, tmp / "weights.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return Path(path)


def load_weights_dir(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(state, meta) of a weights directory; anything missing, foreign or corrupt is an ``EngineError`` (400)."""
    path = Path(path)
    meta_file, data_file = path / "meta.json", path / "weights.pt"
    if not meta_file.is_file() or not data_file.is_file():
        raise EngineError(f"{path}: not a weights directory (needs meta.json and weights.pt)", status=400)
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise EngineError(f"{meta_file}:{exc.lineno}: invalid JSON ({exc.msg})", status=400) from None
    if meta.get("format") != FORMAT:
        raise EngineError(f"{meta_file}: format {meta.get('format')!r}, expected {FORMAT!r}", status=400)
    try:
        state = torch.load(data_file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a truncated or foreign file
        raise EngineError(f"{data_file}: cannot be read ({type(exc).__name__}: {exc})", status=400) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EngineError(f"{data_file}: expected a flat mapping of name to tensor", status=400)
    checksum = weights_checksum(state)
    if checksum != meta.get("checksum"):
        raise EngineError(f"{path}: checksum {checksum[:12]}… does not match meta.json "
                          f"{str(meta.get('checksum'))[:12]}…", status=400)
    return state, meta
