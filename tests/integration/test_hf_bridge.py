"""HF Qwen2/Qwen3 directories ⇄ megatron GPTModel: same logits (tree positions too), bit-identical round trip,
a negative control for the QKV interleave, training from hf_path and exporting back, the engine's policy."""
import json

import pytest
import torch

from gyre_hpc.config import ModelConfig
from gyre_hpc.errors import ConfigError

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

#: (arch, init_model keywords): Qwen2 (qkv bias), Qwen3 with head_dim != hidden/heads, Qwen3 tied
MODELS = {"qwen2": ("qwen2", {}), "qwen3": ("qwen3", {"head_dim": 32}), "qwen3_tied": ("qwen3", {"tie": True})}
TOL = 1e-4
#: two rows of tree position ids: a prefix 0..3, then branches restarting at 4 (non-monotonic), as packing makes
TREE_POS = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 4, 5, 4, 5, 6, 7, 5], [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 3, 4, 5]])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from gyre_hpc.models.init import init_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf")
    return {name: init_model(arch, root / name, context=256, seed=1, **kw) for name, (arch, kw) in MODELS.items()}


def ids_for(cfg: ModelConfig) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, TREE_POS.shape, generator=torch.Generator().manual_seed(0))


def logit_diff(path, attention: str = "local") -> float:
    from gyre_hpc.models.check import hf_logits, megatron_logits
    from gyre_hpc.train.model import build_model

    cfg = ModelConfig(hf_path=str(path), attention=attention)
    ids = ids_for(cfg)
    return (megatron_logits(build_model(cfg), ids, TREE_POS) - hf_logits(path, ids, TREE_POS)).abs().max().item()


@pytest.mark.parametrize("name", list(MODELS))
def test_megatron_logits_equal_transformers_logits_at_tree_positions(models, name):
    assert logit_diff(models[name]) <= TOL


def test_fused_attention_gives_the_same_logits_with_head_dim_unlike_hidden_over_heads(models):
    assert logit_diff(models["qwen3"], attention="sdpa") <= TOL


@pytest.mark.parametrize("name", list(MODELS))
def test_export_then_reload_is_bit_identical(models, name):
    from gyre_hpc.models.check import roundtrip
    from gyre_hpc.train.model import build_model

    cfg = ModelConfig(hf_path=str(models[name]))
    assert roundtrip(models[name], build_model(cfg), cfg)


def test_a_plain_qkv_concatenation_is_caught(models, monkeypatch):
    """Negative control: [q; k; v] without the per-query-group interleave must make the logits test fail."""
    from gyre_hpc.train import hf_weights as weights

    monkeypatch.setattr(weights, "interleave_qkv", lambda q, k, v, cfg: torch.cat([q, k, v], dim=0))
    assert logit_diff(models["qwen3"]) > 100 * TOL


def test_trainer_starts_from_hf_weights_and_its_export_loads_in_transformers(models, tmp_path):
    import yaml
    from transformers import AutoModelForCausalLM
    from train_batches import fork_pair

    from gyre_hpc.config import GyreConfig, TrainConfig, to_dict
    from gyre_hpc.train import hf_weights as weights
    from gyre_hpc.models.export import export
    from gyre_hpc.train.hf_io import read_safetensors
    from gyre_hpc.train.step import Trainer

    cfg = ModelConfig(hf_path=str(models["qwen3"]))
    trainer = Trainer(cfg, TrainConfig(lr=1e-2), seed=5)
    start = weights.to_hf(trainer.export_weights(), cfg)
    assert all(torch.equal(start[k], v) for k, v in read_safetensors(models["qwen3"]).items())
    trainer.step(fork_pair([(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5)], seed=1)[0])
    run = tmp_path / "run"
    trainer.save_checkpoint(run / "checkpoints" / "latest")
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(GyreConfig(model=cfg))))
    out = export(run, tmp_path / "exported")
    trained = weights.to_hf(trainer.export_weights(), cfg)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    assert all(torch.equal(hf[k], v) for k, v in trained.items())
    assert not torch.equal(trained["model.embed_tokens.weight"], start["model.embed_tokens.weight"])
    written = json.loads((out / "config.json").read_text())
    assert (out / "tokenizer.json").is_file() and (written["vocab_size"], written["dtype"]) == (1024, "float32")
    with pytest.raises(ConfigError, match="exists"):
        export(run, out)
    assert export(run, out, overwrite=True) == out


def test_a_missing_or_foreign_tensor_is_refused_by_name(models):
    from gyre_hpc.errors import CheckpointError
    from gyre_hpc.train import hf_weights as weights
    from gyre_hpc.train.hf_io import read_safetensors

    cfg = ModelConfig(hf_path=str(models["qwen2"]))
    hf = read_safetensors(models["qwen2"])
    with pytest.raises(CheckpointError, match=r"lacks model\.layers\.1\.self_attn\.k_proj\.bias"):
        weights.to_megatron({k: v for k, v in hf.items() if k != "model.layers.1.self_attn.k_proj.bias"}, cfg)
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.experts.0.weight"):
        weights.to_megatron({**hf, "model.layers.0.mlp.experts.0.weight": torch.zeros(1)}, cfg)


def test_engine_policy_serves_the_hf_model(models):
    from gyre_hpc.localengine.policy import MegatronPolicy
    from gyre_hpc.models.check import hf_logits

    cfg = ModelConfig(hf_path=str(models["qwen2"]))
    seq = [5, 9, 300, 17, 1000, 2]
    got = MegatronPolicy(cfg, seed=3).next_token_logits([seq])[0]
    want = hf_logits(models["qwen2"], torch.tensor([seq]), torch.arange(len(seq)).unsqueeze(0))[0, -1]
    assert float((torch.from_numpy(got) - want).abs().max()) <= TOL
