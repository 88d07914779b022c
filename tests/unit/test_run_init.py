"""gyre_hpc.models.run_init without torch: which model sections get an initial HF directory, which are refused
(before anything is written), and that a run directory without one leaves the config as it is."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.models import run_init

CONFIG = "configs/local.yaml"


def test_the_default_config_is_a_qwen3_format_model_with_a_context_of_at_least_4096():
    cfg = load_config(CONFIG)
    m = cfg.model
    assert m.hf_path is None and run_init.wanted(m)
    assert (m.qk_layernorm, m.qkv_bias, m.swiglu, m.normalization, m.position_embedding) == (
        True, False, True, "RMSNorm", "mrope")
    assert (m.norm_eps, m.rotary_base, m.tie_embeddings) == (1e-6, 1_000_000, False)
    assert m.heads % (m.kv_heads or m.heads) == 0 and (m.kv_heads or m.heads) < m.heads  # grouped-query, as Qwen3
    assert m.max_seq_len >= 4096 and 4096 <= cfg.engine.context_len <= m.max_seq_len
    run_init.check_qwen3(m)


def test_the_synthetic_workload_fits_the_default_vocabulary():
    from gyre_hpc.agents.workload import Workload

    cfg = load_config(CONFIG)
    work = Workload(cfg.agent, cfg.model.vocab_size, seed=0)
    tokens = list(work.system) + [t for i in range(8) for t in work.task(i).tokens]
    assert tokens and max(tokens) < cfg.model.vocab_size


def test_a_megatron_only_model_gets_no_directory_and_keeps_its_config(tmp_path):
    cfg = load_config(CONFIG, ["model.qk_layernorm=false", "model.vocab_size=256"])
    assert not run_init.wanted(cfg.model)
    assert run_init.materialise(cfg, tmp_path) is None
    assert run_init.for_run(cfg, tmp_path) == cfg
    assert list(tmp_path.iterdir()) == []


def test_a_run_directory_without_the_initial_model_leaves_the_config_as_loaded(tmp_path):
    cfg = load_config(CONFIG)
    assert run_init.for_run(cfg, tmp_path) == cfg  # a run from before RUN_DIR/model/init: resumed as it was


@pytest.mark.parametrize("override, key", [
    ("model.normalization=LayerNorm", "model.normalization"),
    ("model.position_embedding=learned_absolute", "model.position_embedding"),
    ("model.swiglu=false", "model.swiglu"),
    ("model.qkv_bias=true", "model.qkv_bias"),
    ("model.vocab_size=256", "model.vocab_size"),
])
def test_a_qwen3_format_model_that_a_qwen3_checkpoint_cannot_hold_is_refused_before_writing(tmp_path, override, key):
    cfg = load_config(CONFIG, [override])
    with pytest.raises(ConfigError, match=key):
        run_init.materialise(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []



def test_preparing_a_run_without_an_initial_model_writes_nothing_and_keeps_the_config(tmp_path):
    cfg = load_config(CONFIG, ["model.qk_layernorm=false", "model.vocab_size=256"])
    assert run_init.prepare(cfg, tmp_path, "gyre train") == cfg
    assert list(tmp_path.iterdir()) == []
