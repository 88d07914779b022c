"""``cell.engine_weights``: the directory a rollout cell's engine starts from. SGLang starts on the HF directory
the trainer's version 0 was loaded from (engine.model_path, else model.hf_path); the local engine keeps its
configured start. Later versions never come from disk (the one road: tests/integration/test_weight_sync.py)."""
import pytest

from gyre_hpc.config import EngineConfig, ModelConfig

pytestmark = [pytest.mark.megatron]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from gyre_hpc.models.init import init_model

    return init_model("qwen3", tmp_path_factory.mktemp("ew") / "model", context=256)


def test_sglang_starts_on_the_model_directory_or_engine_model_path(model_dir):
    from gyre_hpc.live.engine_weights import start_model_dir

    model = ModelConfig(hf_path=str(model_dir))
    assert start_model_dir(EngineConfig(kind="sglang"), model) == str(model_dir)
    assert start_model_dir(EngineConfig(kind="sglang", model_path="/elsewhere"), model) == "/elsewhere"


def test_the_local_engine_keeps_its_configured_start(model_dir):
    from gyre_hpc.live.engine_weights import start_model_dir

    assert start_model_dir(EngineConfig(kind="local"), ModelConfig()) is None
    assert start_model_dir(EngineConfig(kind="local", model_path="/x"), ModelConfig(hf_path=str(model_dir))) == "/x"


def test_sglang_without_a_model_directory_is_refused_naming_the_key():
    from gyre_hpc.live.engine_weights import start_model_dir
    from gyre_hpc.errors import EngineError

    with pytest.raises(EngineError, match="model.hf_path"):
        start_model_dir(EngineConfig(kind="sglang"), ModelConfig())
