"""Reading and writing Hugging Face model directories: the layout transformers and SGLang's ``--model-path`` load.

::

    <dir>/config.json              architecture, sizes, token ids (``gyre_hpc.files.hf_config``)
    <dir>/model.safetensors        HF tensor names (``gyre_hpc.train.hf_weights``), float32
    <dir>/generation_config.json   bos/eos/pad token ids
    <dir>/tokenizer.json, tokenizer_config.json, ...   whatever tokenizer files the source directory holds

Invariants
- ``write_model_dir`` is atomic: the directory appears complete (``gyre_hpc.files.io.atomic_dir``) or not at all, and an
  existing directory is replaced only when asked (``overwrite``).
- Tensors are written as given (contiguous copies, same dtype): reading back gives bit-identical tensors.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from gyre_hpc.errors import CheckpointError, ConfigError
from gyre_hpc.files.io import atomic_dir

#: files of a source directory that are not tokenizer files (written anew, never copied)
WEIGHT_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``path`` (a name in two files is an error)."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files (only safetensors checkpoints are read)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(f)
        twice = sorted(set(part) & set(out))
        if twice:
            raise CheckpointError(f"{f}: tensors also found in another file: {twice[:3]}")
        out.update(part)
    return out


def generation_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A generation_config.json from config.json's token ids (greedy decoding off: sampling is the engine's)."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {**{k: hf[k] for k in keys if hf.get(k) is not None}, "do_sample": True}


def is_tokenizer_file(f: Path) -> bool:
    return f.is_file() and f.name not in WEIGHT_FILES and f.suffix not in (".safetensors", ".bin", ".pt")


def write_model_dir(out: str | Path, hf_config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                    tokenizer_from: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write config.json, model.safetensors, generation_config.json (and the tokenizer files of
    ``tokenizer_from``, with its generation_config.json when it has one) to ``out`` atomically."""
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --force to replace it")
    with atomic_dir(out) as tmp:
        os.chmod(tmp, 0o755)
        if tokenizer_from is not None:
            for f in sorted(Path(tokenizer_from).iterdir()):
                if is_tokenizer_file(f):
                    shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(dict(hf_config), indent=2) + "\n")
        gen = Path(tokenizer_from) / "generation_config.json" if tokenizer_from is not None else None
        if gen is not None and gen.is_file():
            shutil.copy2(gen, tmp / gen.name)
        else:
            (tmp / "generation_config.json").write_text(json.dumps(generation_config(hf_config), indent=2) + "\n")
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp / "model.safetensors",
                  metadata={"format": "pt"})
        for f in tmp.iterdir():
            f.chmod(0o644)
    return out
