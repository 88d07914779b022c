"""The model directory a rollout cell's engine loads for a published version: the one place that picks the
engine's weight format (the disk road; a later road, ``/update_weights_from_distributed``, replaces its two
callers in ``cell.rollout``: ``start`` and ``refresh``).

::

    engine.kind local    weights/v000003            the published directory itself (weights.pt + meta.json)
    engine.kind sglang   weights/v000003/hf         a Hugging Face directory (config.json, model.safetensors,
                                                    tokenizer) that SGLang's --model-path and
                                                    /update_weights_from_disk load; written once, from the
                                                    published tensors, by ``gyre model export``'s code
                         version 0 / none yet       engine.model_path if set, else model.hf_path (the directory
                                                    the trainer's version 0 was loaded from: no export)

Invariants
- A returned directory is complete: ``hf_io.write_model_dir`` renames a finished temporary directory into place.
  Two cells that export the same version at once both return it (the one whose rename loses uses the other's).
- The exported tensors are ``models.weights.to_hf`` of the published megatron tensors with the run's
  ``model.hf_path`` config.json and tokenizer files: what ``gyre model export RUN_DIR`` writes for that version.
"""
from __future__ import annotations

from pathlib import Path

from gyre_hpc.config import GyreConfig
from gyre_hpc.errors import ConfigError, EngineError

HF_SUBDIR = "hf"


def initial_dir(cfg: GyreConfig) -> str:
    """The HF directory an SGLang engine starts from before any step: engine.model_path, else model.hf_path."""
    path = cfg.engine.model_path or cfg.model.hf_path
    if path is None:
        raise EngineError("engine.kind=sglang serves a Hugging Face model directory: set model.hf_path "
                          "(gyre model init --arch qwen3 --out DIR)")
    return str(path)


def engine_model_dir(cfg: GyreConfig, latest: dict | None) -> str | None:
    """The directory the engine loads for the ``LATEST.json`` record ``latest`` (None: no version published yet;
    returns None when the engine's own configured start applies, i.e. the local engine before any version)."""
    if cfg.engine.kind == "local":
        return None if latest is None else str(latest["path"])
    if latest is None or int(latest["version"]) == 0:
        return initial_dir(cfg)
    return str(export_hf(Path(latest["path"])))


def export_hf(version_dir: Path) -> Path:
    """``version_dir/hf``: the HF form of the published weights in ``version_dir``, exported on first use."""
    from gyre_hpc.models.export import export

    out = version_dir / HF_SUBDIR
    if (out / "model.safetensors").is_file():
        return out
    try:
        return export(version_dir, out)
    except (ConfigError, OSError):
        if (out / "model.safetensors").is_file():  # another cell exported it meanwhile
            return out
        raise
