"""A 16K-token tree row trains exactly as its flat packing, on the CPU, through tree attention (no [T, T] tensor)
and the chunked output layer (real megatron; a one-layer model keeps it to about a minute)."""
import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_a_16k_token_tree_trains_exactly_as_its_flat_packing():
    """4 paths of 6,552 tokens sharing half (a 16,380-token tree row; the flat rows hold 26,208 tokens)."""
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.step import Trainer

    torch.set_num_threads(2)
    n = 3276
    tree, flat = fork_pair([(1, n, [n, n, n, n], 0.5)], seed=11)
    assert tree.tokens == 16380 and flat.tokens == 8 * n and tree.trained_tokens == flat.trained_tokens
    model = ModelConfig(layers=1, hidden=32, heads=2, kv_heads=1, ffn=64, max_seq_len=8192)
    trainer = Trainer(model, TrainConfig(logits_chunk_tokens=4096), seed=0)
    assert model.attention == "tree"
    lt, gt = trainer.loss_and_grads(tree)
    lf, gf = trainer.loss_and_grads(flat)
    assert np.isfinite(lt) and abs(lt - lf) <= 1e-5 * abs(lf)
    assert set(gt) == set(gf) and max(rel(gt[k], gf[k]) for k in gf) <= 1e-5
