"""``gyre model check``: does megatron compute what transformers computes, and does export give back the input?

- ``max_abs_logit_diff``: transformers' forward against megatron's forward (``build_model`` with ``hf_path``) on the
  same seeded token ids, float32, causal attention; position ids may be any (tree) positions.
- ``roundtrip_identical``: megatron weights → ``to_hf`` → a written directory → read back and loaded into megatron
  again gives bit-identical tensors, both in HF names (against the source safetensors) and in megatron names.

Invariants
- A check never writes into the model directory (the round trip goes through a temporary directory).
- The same directory and seed give the same ids, hence the same report.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from gyre_hpc.config import ModelConfig
from gyre_hpc.files import hf_config
from gyre_hpc.train import hf_io, hf_weights as weights


def causal_mask(s: int) -> torch.Tensor:
    return torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)


def megatron_logits(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    from gyre_hpc.train.model import forward_logits

    with torch.no_grad():
        return forward_logits(model, ids, pos, causal_mask(ids.shape[1])).float()


def hf_logits(path: str | Path, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids, position_ids=pos).logits.float()


def sample_ids(cfg: ModelConfig, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ids ``[batch, seq]`` and plain positions 0..seq-1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    return ids, torch.arange(seq).unsqueeze(0).expand(batch, seq).contiguous()


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def roundtrip(path: str | Path, model: torch.nn.Module, cfg: ModelConfig) -> bool:
    """Export ``model`` to a temporary HF directory; True when it re-reads bit-identical (HF and megatron names)."""
    from gyre_hpc.train.checkpoint import gather_full
    from gyre_hpc.train.model import build_model

    source = hf_io.read_safetensors(path)
    if cfg.tie_embeddings:
        source.pop("lm_head.weight", None)
    exported = weights.to_hf(gather_full(model, cfg.swiglu), cfg)
    with tempfile.TemporaryDirectory(prefix="gyre-check-") as tmp:
        out = hf_io.write_model_dir(Path(tmp) / "model", hf_config.read_config(path), exported, tokenizer_from=path)
        again = hf_io.read_safetensors(out)
        reloaded = build_model(ModelConfig(hf_path=str(out), attention=cfg.attention))
        return identical(source, again) and identical(state(model), state(reloaded))


def check_model(path: str | Path, seq: int = 32, batch: int = 2, seed: int = 0) -> dict[str, Any]:
    """The report ``gyre model check DIR --json`` prints."""
    from gyre_hpc.train.model import build_model

    hf = hf_config.read_config(path)
    arch = hf_config.architecture(hf)
    cfg = ModelConfig(hf_path=str(path))
    model = build_model(cfg).eval()
    ids, pos = sample_ids(cfg, batch, min(seq, cfg.max_seq_len), seed)
    diff = (megatron_logits(model, ids, pos) - hf_logits(path, ids, pos)).abs().max().item()
    params = sum(t.numel() for t in hf_io.read_safetensors(path).values())
    return {"arch": arch, "params": int(params), "max_abs_logit_diff": float(diff),
            "roundtrip_identical": roundtrip(path, model, cfg)}
