"""The model directory a rollout cell's engine starts from (its version 0); later versions never come from disk.

::

    engine.kind local    engine.model_path as configured (null: the seed's initial weights, or model.hf_path's)
    engine.kind sglang   engine.model_path if set, else model.hf_path: the Hugging Face directory the trainer's
                         version 0 was loaded from (SGLang's --model-path)

Every newer version reaches a running engine by the one road (docs/weights.md): the cell pulls the core's
published buffer and pushes it over ``/update_weights_from_distributed`` (``engines.weight_sync``), for both kinds.

Invariant: an SGLang engine starts on exactly the weights the trainer's version 0 holds, or the job refuses to
start with a message naming the key to set.
"""
from __future__ import annotations

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.errors import EngineError


def start_model_dir(engine: EngineConfig, model: ModelConfig) -> str | None:
    """The directory ``engine.model_path`` takes when the cell starts its engine (see the module docstring)."""
    if engine.kind == "local":
        return engine.model_path
    path = engine.model_path or model.hf_path
    if path is None:
        raise EngineError("engine.kind=sglang serves a Hugging Face model directory: set model.hf_path "
                          "(gyre model init --arch qwen3 --out DIR), or leave it null with a Qwen3-format model "
                          "section so the run writes RUN_DIR/model/init")
    return str(path)
