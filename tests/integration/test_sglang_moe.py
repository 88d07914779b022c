"""A real SGLang server serves a Qwen3-MoE checkpoint on the CPU as Hugging Face computes it: greedy tokens and their
logprobs from ``sglang.launch_server`` (its ``Qwen3MoeForCausalLM``, ``FusedMoE`` on the CPU path) against
transformers' forward of the same directory in float32. The trainer's side of the same model is pinned against
transformers in tests/integration/test_moe.py, so the three agree: what the engines serve is what the trainer
trains (issue 28: MoE end to end)."""
from __future__ import annotations

import pytest

from gyre_hpc.config import EngineConfig, ModelConfig
from gyre_hpc.engines.launch import on_free_port, start_engine

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPT = [5, 17, 42, 99, 3, 250, 7]
NEW = 12


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from gyre_hpc.models.init import init_model

    return init_model("qwen3_moe", tmp_path_factory.mktemp("moe") / "qwen3-moe-tiny", head_dim=16, experts=4,
                      topk=2, moe_ffn=32)


@pytest.fixture(scope="module")
def served(moe_dir, tmp_path_factory):
    cfg = EngineConfig(kind="sglang", model_path=str(moe_dir), max_running_requests=4, context_len=256,
                       startup_timeout_s=900.0, request_timeout_s=300.0)
    handle = on_free_port(start_engine, cfg, ModelConfig(), log_path=tmp_path_factory.mktemp("log") / "engine.log",
                          name="moe")
    try:
        with handle.client() as client:
            yield client.generate(PROMPT, {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True},
                                  return_logprob=True)
    finally:
        handle.stop()


def reference(moe_dir, ids: list[int]):
    """transformers' float32 log-softmax of the next token at every position of ``ids``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def test_sglang_serves_the_moe_checkpoints_greedy_tokens_with_its_logprobs(served, moe_dir):
    out = list(served.output_ids)
    assert len(out) == NEW and served.logprobs is not None and len(served.logprobs) == NEW
    logp = reference(moe_dir, PROMPT + out)
    at = range(len(PROMPT) - 1, len(PROMPT) - 1 + NEW)  # the position that predicts each generated token
    want = [float(logp[p, t]) for p, t in zip(at, out)]
    greedy = [int(logp[p].argmax()) for p in at]
    assert out == greedy, (out, greedy)  # every generated token is transformers' argmax after its prefix
    diff = max(abs(a - b) for a, b in zip(served.logprobs, want))
    assert diff < 1e-3, (served.logprobs, want)  # float rounding of two float32 forwards, routing alike
