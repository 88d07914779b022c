"""Qwen3-MoE config.json ⇄ ModelConfig, the MoE rows of the mapping table, expert names under expert parallel,
and train.expert_parallel validated at load."""
import pytest

from gyre_hpc.config import GyreConfig, ModelConfig, build
from gyre_hpc.errors import ConfigError, UnsupportedModelError
from gyre_hpc.files.hf_config import hf_config_dict, model_fields

MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1024, "hidden_size": 64,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
       "intermediate_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
       "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": False,
       "hidden_act": "silu", "attention_bias": False, "num_local_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_qwen3_moe_maps_experts_topk_ffn_and_normalisation_both_ways():
    f = model_fields(MOE)
    assert (f["experts"], f["experts_topk"], f["moe_ffn"], f["norm_topk"], f["qk_layernorm"]) == (8, 2, 32, True, True)
    assert model_fields(hf_config_dict(f, "Qwen3MoeForCausalLM")) == f  # num_experts, the key transformers reads
    assert model_fields({**MOE, "num_experts": 4})["experts"] == 4


@pytest.mark.parametrize("key, value", [("mlp_only_layers", [0]), ("decoder_sparse_step", 2),
                                        ("num_local_experts", 0), ("shared_expert_intermediate_size", 64)])
def test_a_variant_the_mapping_cannot_reproduce_is_refused_by_name(key, value):
    with pytest.raises(UnsupportedModelError, match=key.split("_")[0]):
        model_fields({**MOE, key: value})


def test_the_table_has_router_and_every_expert_instead_of_the_dense_mlp():
    pytest.importorskip("torch")
    from gyre_hpc.train.hf_weights import entries

    cfg = ModelConfig(experts=4, experts_topk=2, moe_ffn=8, hidden=16, heads=2, layers=2, ffn=32, vocab_size=40,
                      qk_layernorm=True)
    rows = entries(cfg)
    names = {m for m, _, _ in rows}
    assert "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight" in names
    assert "decoder.layers.0.mlp.router.weight" in names and not any(n.endswith("mlp.linear_fc1.weight") for n in names)
    assert ("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight",
            ("model.layers.1.mlp.experts.3.gate_proj.weight", "model.layers.1.mlp.experts.3.up_proj.weight"),
            "gate_up") in rows
    assert len(rows) == len(entries(ModelConfig(qk_layernorm=True))) + 2 * (1 + 2 * 4) - 2 * 2


def test_expert_names_map_between_local_and_global_indices():
    pytest.importorskip("torch")
    from gyre_hpc.train.moe import global_name, local_name

    n = "decoder.layers.1.mlp.experts.local_experts.5.linear_fc1.weight"
    assert local_name(n, rank=1, local_experts=4) == "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"
    assert local_name(n, rank=0, local_experts=4) is None
    assert global_name(local_name(n, 1, 4), 1, 4) == n
    assert local_name("decoder.layers.1.mlp.router.weight", 1, 4) == "decoder.layers.1.mlp.router.weight"


def test_expert_parallel_is_validated_at_load():
    moe = {"experts": 4, "qk_layernorm": True}
    build(GyreConfig, {"model": moe, "train": {"expert_parallel": 2}})
    with pytest.raises(ConfigError, match=r"train\.expert_parallel: 3 must divide model\.experts=4"):
        build(GyreConfig, {"model": moe, "train": {"expert_parallel": 3}})
    with pytest.raises(ConfigError, match=r"train\.expert_parallel: 2 must divide model\.experts=0"):
        build(GyreConfig, {"train": {"expert_parallel": 2}})
    with pytest.raises(ConfigError, match=r"cluster\.tensor_parallel"):
        build(GyreConfig, {"model": moe, "cluster": {"tensor_parallel": 2}})
    with pytest.raises(ConfigError, match=r"model\.experts_topk"):
        build(GyreConfig, {"model": {**moe, "experts_topk": 5}})


def test_the_distributed_optimizer_beside_expert_parallel_is_refused_at_load_naming_the_key():
    moe = {"experts": 4, "qk_layernorm": True}
    build(GyreConfig, {"model": moe, "train": {"expert_parallel": 2}})
    build(GyreConfig, {"model": moe, "train": {"distributed_optimizer": True}})
    with pytest.raises(ConfigError, match=r"train\.distributed_optimizer: true with expert_parallel 2"):
        build(GyreConfig, {"model": moe, "train": {"expert_parallel": 2, "distributed_optimizer": True}})
