"""``cell.engine_weights``: the directory a rollout cell's engine loads per published version — the published
weights directory for the local engine; for SGLang the model's own HF directory at version 0 and, later, an HF
directory exported once per version from the published tensors (what ``gyre model export`` writes)."""
import dataclasses

import pytest
import torch
import yaml

from gyre_hpc.config import EngineConfig, GyreConfig, ModelConfig, to_dict

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory whose core published version 1 (trained weights) the way CoreTrainer.publish does."""
    from gyre_hpc.cell import store
    from gyre_hpc.engines.weights import save_weights
    from gyre_hpc.models.init import init_model
    from gyre_hpc.train.step import Trainer

    root = tmp_path_factory.mktemp("ew")
    model = init_model("qwen3", root / "model", context=256)
    cfg = GyreConfig(model=ModelConfig(hf_path=str(model)), engine=EngineConfig(kind="sglang"))
    run_dir = root / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    trainer = Trainer(cfg.model, cfg.train, seed=0)
    state = {k: v + 0.5 for k, v in trainer.export_weights().items()}  # differs from the model's own weights
    path = save_weights(store.version_dir(run_dir, 1), state, "1")
    store.write_latest(run_dir, 1, path, None)
    return cfg, run_dir, state


def test_sglang_loads_the_trained_version_as_an_hf_directory_with_the_published_tensors(run):
    from gyre_hpc.cell import store
    from gyre_hpc.cell.engine_weights import engine_model_dir
    from gyre_hpc.models import weights
    from gyre_hpc.models.hf_io import read_safetensors

    cfg, run_dir, state = run
    out = engine_model_dir(cfg, store.read_latest(run_dir))
    assert out == str(store.version_dir(run_dir, 1) / "hf")
    loaded = read_safetensors(out)
    expected = weights.to_hf(state, cfg.model)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], v) for k, v in expected.items())
    files = {p.name for p in store.version_dir(run_dir, 1).joinpath("hf").iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= files


def test_a_second_cell_reuses_the_exported_directory(run):
    from gyre_hpc.cell import store
    from gyre_hpc.cell.engine_weights import engine_model_dir

    cfg, run_dir, _ = run
    first = engine_model_dir(cfg, store.read_latest(run_dir))
    stamp = (store.version_dir(run_dir, 1) / "hf" / "model.safetensors").stat().st_mtime_ns
    assert engine_model_dir(cfg, store.read_latest(run_dir)) == first
    assert (store.version_dir(run_dir, 1) / "hf" / "model.safetensors").stat().st_mtime_ns == stamp


def test_version_zero_is_the_model_directory_or_engine_model_path_and_the_local_engine_takes_the_published_dir(run):
    from gyre_hpc.cell.engine_weights import engine_model_dir
    from gyre_hpc.errors import EngineError

    cfg, run_dir, _ = run
    v0 = {"version": 0, "path": str(run_dir / "weights" / "v000000")}
    assert engine_model_dir(cfg, v0) == cfg.model.hf_path and engine_model_dir(cfg, None) == cfg.model.hf_path
    other = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model_path="/elsewhere"))
    assert engine_model_dir(other, v0) == "/elsewhere"
    local = dataclasses.replace(cfg, engine=EngineConfig(kind="local"))
    assert engine_model_dir(local, v0) == v0["path"] and engine_model_dir(local, None) is None
    bare = GyreConfig(engine=EngineConfig(kind="sglang"))
    with pytest.raises(EngineError, match="model.hf_path"):
        engine_model_dir(bare, None)
