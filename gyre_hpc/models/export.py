"""``gyre model export``: the project's trained weights → a Hugging Face directory.

Sources, and where the model config comes from (``config.yaml`` of the run directory)::

    RUN_DIR                   weights/LATEST.json's version (live runs), else weights/ (``--sync`` runs), else
                              checkpoints/latest, else resume/checkpoint
    RUN_DIR/weights/v000007   a weights directory (weights.pt + meta.json, full megatron tensors)
    RUN_DIR/checkpoints/latest, RUN_DIR/resume/checkpoint
                              a training checkpoint (rank000.pt ...; tensor-parallel shards are merged)

The run must have trained a model loaded from ``model.hf_path``: its config.json and tokenizer files are the
exported directory's, with the trained tensors (``gyre_hpc.train.hf_weights.to_hf``).

Invariants
- config.json's ``dtype`` names the dtype of the tensors written (the trainer's float32, whatever the source).
- The output directory appears whole or not at all (``hf_io.write_model_dir``); an existing one is replaced only
  with ``overwrite``.
- Tensor-parallel shards merge along the dimension megatron split them (``checkpoint.TP_DIM``), SwiGLU ``linear_fc1`` as
  [gate_0..gate_n; up_0..up_n], so a TP=n checkpoint exports the same tensors as the TP=1 model would.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from gyre_hpc.config import GyreConfig, ModelConfig, build, read_yaml
from gyre_hpc.errors import CheckpointError, UnsupportedModelError
from gyre_hpc.files import hf_config
from gyre_hpc.train import hf_io, hf_weights as weights
from gyre_hpc.train.checkpoint import merge_tp

def _run_config(start: Path) -> tuple[Path, ModelConfig]:
    """The run directory at or above ``start`` (it holds config.yaml) and its model config."""
    for d in (start, *start.parents[:3]):
        if (d / "config.yaml").is_file():
            return d, build(GyreConfig, read_yaml(d / "config.yaml")).model
    raise CheckpointError(f"{start}: no config.yaml in it or its parents; export needs the run's model config")


def read_checkpoint(path: Path, swiglu: bool) -> dict[str, torch.Tensor]:
    """The model tensors of a training checkpoint (its per-rank safetensors files only: no pickle is read)."""
    from safetensors.torch import load_file

    from gyre_hpc.train.checkpoint import rank_files

    meta = json.loads((path / "meta.json").read_text())
    tp = int(meta.get("tensor_parallel", 1))
    ranks = []
    for r in range(tp):
        weights = rank_files(path, r)[0]
        if not weights.is_file():
            raise CheckpointError(f"{weights}: missing (rank {r} of a tensor-parallel-{tp} checkpoint)")
        ranks.append(load_file(str(weights)))
    return merge_tp(ranks, swiglu)


def read_weights(src: Path, swiglu: bool) -> tuple[dict[str, torch.Tensor], Path]:
    """Full megatron tensors of ``src`` (any source above) and the directory they came from."""
    from gyre_hpc.engines.weights import load_weights_dir

    if (src / "config.yaml").is_file():
        latest = src / "weights" / "LATEST.json"
        if latest.is_file():
            path = Path(json.loads(latest.read_text())["path"])
            src = path if path.is_dir() else src / "weights" / path.name  # a path relative to another cwd
        elif (src / "weights" / "weights.pt").is_file():  # the synchronous loop (gyre train --sync)
            src = src / "weights"
        elif (src / "checkpoints" / "latest" / "meta.json").is_file():
            src = src / "checkpoints" / "latest"
        elif (src / "resume" / "checkpoint" / "meta.json").is_file():
            src = src / "resume" / "checkpoint"
        else:
            raise CheckpointError(f"{src}: the run holds no weights yet (weights/, checkpoints/latest, resume/)")
    if (src / "weights.pt").is_file():
        return load_weights_dir(src)[0], src
    if (src / "meta.json").is_file() and (src / "rank000.safetensors").is_file():
        return read_checkpoint(src, swiglu), src
    raise CheckpointError(f"{src}: neither a run directory, a weights directory nor a checkpoint")


def export(src: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write the HF directory of the weights in ``src`` (a run, weights or checkpoint directory) to ``out``."""
    src = Path(src)
    if not src.is_dir():
        raise CheckpointError(f"{src}: no such directory")
    _, cfg = _run_config(src)
    if cfg.hf_path is None:
        raise UnsupportedModelError(f"{src}: the run trained the built-in random model (model.hf_path: null), which "
                                    f"has no Hugging Face form; train from a model directory (gyre model init)")
    full, _ = read_weights(src, cfg.swiglu)
    tensors = weights.to_hf(full, cfg)
    hf = hf_config.read_config(cfg.hf_path)
    hf.pop("torch_dtype", None)  # transformers 4's name; the tensors written are the trainer's (float32)
    hf["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    return hf_io.write_model_dir(out, hf, tensors, tokenizer_from=cfg.hf_path, overwrite=overwrite)
