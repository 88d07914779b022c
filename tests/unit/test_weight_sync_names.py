"""What the weight road sends: Hugging Face names when the model has an HF form, megatron names otherwise, and the
bodies of the distributed-update endpoints the local engine accepts (SGLang's keys and defaults)."""
import pytest
import torch

from gyre_hpc.config import ModelConfig
from gyre_hpc.engines.protocol import EngineRequestError
from gyre_hpc.localengine.weight_routes import parse_init_group, parse_update_distributed, to_model_names
from gyre_hpc.engines.weight_sync import dtype_name, engine_tensors, hf_names
from gyre_hpc.train.hf_weights import entries

pytestmark = pytest.mark.megatron  # needs torch


def _megatron_state(cfg: ModelConfig) -> dict:
    """Random full megatron tensors with the shapes the table implies (no model build needed)."""
    g = torch.Generator().manual_seed(0)
    kv, hd = cfg.kv_heads or cfg.heads, cfg.head_dim or cfg.hidden // cfg.heads
    shapes = {"embedding.word_embeddings.weight": (cfg.vocab_size, cfg.hidden),
              "output_layer.weight": (cfg.vocab_size, cfg.hidden), "decoder.final_layernorm.weight": (cfg.hidden,)}
    for i in range(cfg.layers):
        m = f"decoder.layers.{i}."
        shapes.update({m + "input_layernorm.weight": (cfg.hidden,), m + "pre_mlp_layernorm.weight": (cfg.hidden,),
                       m + "self_attention.linear_qkv.weight": ((cfg.heads + 2 * kv) * hd, cfg.hidden),
                       m + "self_attention.linear_proj.weight": (cfg.hidden, cfg.heads * hd),
                       m + "mlp.linear_fc1.weight": (2 * cfg.ffn, cfg.hidden),
                       m + "mlp.linear_fc2.weight": (cfg.hidden, cfg.ffn)})
    return {k: torch.randn(*s, generator=g) for k, s in shapes.items()}


def test_the_default_model_travels_under_hf_names_and_maps_back_bit_exactly():
    cfg = ModelConfig()
    full = _megatron_state(cfg)
    sent = engine_tensors(full, cfg)
    assert hf_names(cfg) and "model.layers.0.self_attn.q_proj.weight" in sent and "lm_head.weight" in sent
    assert len(sent) == sum(len(h) for _, h, _ in entries(cfg))
    back = to_model_names(sent, cfg, set(full))
    assert set(back) == set(full) and all(torch.equal(back[k], full[k]) for k in full)


@pytest.mark.parametrize("change", [{"normalization": "LayerNorm"}, {"swiglu": False},
                                    {"position_embedding": "learned_absolute"}])
def test_a_model_without_an_hf_form_travels_under_megatron_names(change):
    cfg = ModelConfig(**change)
    full = {"decoder.final_layernorm.weight": torch.ones(4), "decoder.final_layernorm.bias": torch.zeros(4)}
    assert not hf_names(cfg) and set(engine_tensors(full, cfg)) == set(full)
    assert to_model_names(full, cfg, set(full)) is full  # the local engine takes its own names as they are


def test_hf_names_that_do_not_cover_the_model_are_a_400():
    cfg = ModelConfig()
    sent = engine_tensors(_megatron_state(cfg), cfg)
    sent.pop("model.norm.weight")
    with pytest.raises(Exception) as err:
        to_model_names(sent, cfg, {"decoder.final_layernorm.weight"})
    assert getattr(err.value, "status", None) == 400 and "model.norm.weight" in str(err.value)


def test_dtype_names_are_what_sglang_resolves_with_getattr_torch():
    assert [dtype_name(d) for d in (torch.float32, torch.bfloat16)] == ["float32", "bfloat16"]
    assert getattr(torch, dtype_name(torch.float16)) is torch.float16


def test_init_group_body_takes_sglangs_keys_and_refuses_nccl_on_the_cpu_engine():
    body = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2,
            "group_name": "g", "backend": "gloo"}
    assert parse_init_group(body)["rank_offset"] == 1
    with pytest.raises(EngineRequestError) as err:
        parse_init_group({**body, "backend": "nccl"})
    assert err.value.key == "backend"
    with pytest.raises(EngineRequestError) as err:
        parse_init_group({**body, "rank_offset": 2})
    assert err.value.key == "rank_offset"


def test_update_body_needs_matching_names_dtypes_and_shapes_and_defaults_to_no_abort():
    body = {"names": ["a", "b"], "dtypes": ["float32", "bfloat16"], "shapes": [[2, 3], [4]], "weight_version": "3"}
    u = parse_update_distributed(body)
    assert u["abort_all"] is False and u["flush_cache"] is True and u["version"] == "3"
    for key, bad in (("dtypes", ["float32"]), ("shapes", [[2, 3], ["x"]]), ("names", []), ("load_format", "x")):
        with pytest.raises(EngineRequestError) as err:
            parse_update_distributed({**body, key: bad})
        assert err.value.key == key


def test_cpu_engines_meet_over_gloo_and_gpu_engines_over_nccl():
    from gyre_hpc.engines.weight_sync import group_backend

    assert (group_backend("cpu"), group_backend("cuda")) == ("gloo", "nccl")
    assert group_backend("auto") == ("nccl" if torch.cuda.is_available() else "gloo")
