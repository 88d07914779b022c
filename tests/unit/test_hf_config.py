"""HF config.json → ModelConfig: the Qwen fields, refusals by name, and model.hf_path in the config loader."""
import json

import pytest

from gyre_hpc.config import ModelConfig, load_config
from gyre_hpc.errors import ConfigError, UnsupportedModelError
from gyre_hpc.files.hf_config import SUPPORTED, hf_config_dict, model_fields

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1024, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "intermediate_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
         "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": True,
         "hidden_act": "silu", "attention_bias": False, "layer_types": ["full_attention", "full_attention"]}
QWEN2 = {**{k: v for k, v in QWEN3.items() if k not in ("head_dim", "attention_bias")},
         "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": False}


def model_dir(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_qwen3_maps_head_dim_qk_norm_eps_theta_and_tying():
    f = model_fields(QWEN3)
    assert (f["head_dim"], f["qk_layernorm"], f["qkv_bias"], f["norm_eps"]) == (32, True, False, 1e-6)
    assert (f["rotary_base"], f["tie_embeddings"], f["kv_heads"], f["max_seq_len"]) == (1000000, True, 2, 4096)


def test_qwen2_has_qkv_bias_and_no_head_dim():
    f = model_fields(QWEN2)
    assert (f["head_dim"], f["qk_layernorm"], f["qkv_bias"], f["tie_embeddings"]) == (None, False, True, False)


def test_rope_theta_falls_back_to_the_transformers4_key_then_10000():
    old = {k: v for k, v in QWEN2.items() if k != "rope_parameters"}
    assert model_fields({**old, "rope_theta": 5000.0})["rotary_base"] == 5000
    assert model_fields(old)["rotary_base"] == 10000


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2MoeForCausalLM"])
def test_unsupported_architecture_is_refused_by_name_listing_supported(arch):
    with pytest.raises(UnsupportedModelError, match=f"{arch}.*not supported; supported: Qwen2ForCausalLM, "
                                                    f"Qwen3ForCausalLM, Qwen3MoeForCausalLM"):
        model_fields({**QWEN3, "architectures": [arch]})


@pytest.mark.parametrize("change, word", [({"use_sliding_window": True}, "sliding"),
                                          ({"hidden_act": "gelu"}, "gelu"),
                                          ({"attention_bias": True}, "attention_bias"),
                                          ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "yarn"),
                                          ({"layer_types": ["sliding_attention"]}, "sliding_attention")])
def test_variants_the_mapping_cannot_reproduce_are_refused(change, word):
    with pytest.raises(UnsupportedModelError, match=word):
        model_fields({**QWEN3, **change})


@pytest.mark.parametrize("base", [QWEN2, QWEN3], ids=["qwen2", "qwen3"])
def test_fields_to_config_json_and_back_is_the_identity(base):
    f = model_fields(base)
    assert model_fields(hf_config_dict(f, base["architectures"][0])) == f


def test_hf_path_sets_every_architecture_field_and_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    model_dir(tmp_path / "m", QWEN3)
    monkeypatch.chdir(tmp_path)
    cfg = ModelConfig(hf_path="m", attention="sdpa")
    assert cfg.hf_path == str(tmp_path / "m")
    assert (cfg.vocab_size, cfg.hidden, cfg.head_dim, cfg.qk_layernorm, cfg.attention) == (1024, 64, 32, True, "sdpa")


def test_a_field_contradicting_hf_path_is_a_config_error(tmp_path):
    path = model_dir(tmp_path, QWEN3)
    with pytest.raises(ConfigError, match=r"model\.hidden: 128 conflicts with model\.hf_path's config\.json \(64\)"):
        load_config(None, [f"model.hf_path={path}", "model.hidden=128"])
    assert load_config(None, [f"model.hf_path={path}", "model.hidden=64"]).model.hidden == 64


def test_hf_path_without_config_json_or_of_another_arch_fails_at_load(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"model\.hf_path: .*no config\.json"):
        load_config(None, [f"model.hf_path={tmp_path}"])
    path = model_dir(tmp_path, {**QWEN3, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_config(None, [f"model.hf_path={path}"])


def test_without_hf_path_the_model_fields_are_as_written():
    cfg = ModelConfig()
    assert (cfg.hf_path, cfg.head_dim, cfg.qk_layernorm, cfg.qkv_bias, cfg.norm_eps) == (None, None, False, False, 1e-5)
    assert SUPPORTED == ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def test_yield_to_checkpoint_drops_exactly_the_conflicting_fields_so_the_section_builds(tmp_path):
    from pathlib import Path

    from gyre_hpc.config import GyreConfig, apply_overrides, build, read_yaml
    from gyre_hpc.files.hf_config import yield_to_checkpoint

    path = model_dir(tmp_path, QWEN3)  # configs/local.yaml's model but vocab 1024, head_dim 32, tied
    data = apply_overrides(read_yaml(Path(__file__).parents[2] / "configs" / "local.yaml"),
                           [f"model.hf_path={path}"])
    with pytest.raises(ConfigError, match="vocab_size: 512 conflicts"):
        build(GyreConfig, data)
    model, notes = yield_to_checkpoint(data["model"])
    assert notes == ["vocab_size: config 512 -> checkpoint 1024"]
    assert {k for k in data["model"] if k not in model} == {"vocab_size"}
    cfg = build(GyreConfig, {**data, "model": model})
    assert (cfg.model.vocab_size, cfg.model.hidden, cfg.model.head_dim) == (1024, 64, 32)
    assert yield_to_checkpoint({"hidden": 8}) == ({"hidden": 8}, [])  # no hf_path: unchanged
    assert yield_to_checkpoint({"hf_path": str(tmp_path / "none"), "hidden": 8})[1] == []  # building reports
