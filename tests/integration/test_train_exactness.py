"""Tree-packed and flat rows of the same paths give the same loss, gradients and branch logits (real megatron)."""
import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = pytest.mark.megatron

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5), (3, 4, [6], 0.7)]
TOL = 1e-5


@pytest.fixture(scope="module")
def make_trainer():
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.step import Trainer

    torch.set_num_threads(1)

    def make(position_embedding="mrope", attention="tree", **train):
        model = ModelConfig(position_embedding=position_embedding, attention=attention, kv_heads=2)
        return Trainer(model, TrainConfig(**train), seed=0)

    return make


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_same_loss_and_grads(trainer, a, b):
    la, ga = trainer.loss_and_grads(a)
    lb, gb = trainer.loss_and_grads(b)
    assert abs(la - lb) <= TOL * abs(lb)
    assert set(ga) == set(gb) == {n for n, _ in trainer.model.named_parameters()}
    worst = max(rel(ga[n], gb[n]) for n in gb)
    assert worst <= TOL, worst


@pytest.mark.parametrize("position_embedding", ["mrope", "learned_absolute"])
@pytest.mark.parametrize("loss", ["pg", "ppo"])
@pytest.mark.parametrize("attention", ["local", "sdpa", "tree"])
def test_tree_and_flat_give_same_loss_and_gradients(make_trainer, position_embedding, loss, attention):
    tree, flat = fork_pair(GROUPS, seed=1, old_logprob=-5.0)
    assert tree.trained_tokens == flat.trained_tokens and tree.tokens < flat.tokens
    assert_same_loss_and_grads(make_trainer(position_embedding, attention, loss=loss), tree, flat)


def test_sdpa_core_attention_computes_what_megatron_local_attention_computes(make_trainer):
    from gyre_hpc.train.attention import SDPAttention

    local, sdpa = make_trainer(attention="local"), make_trainer(attention="sdpa")
    assert all(isinstance(layer.self_attention.core_attention, SDPAttention) for layer in sdpa.model.decoder.layers)
    assert not isinstance(local.model.decoder.layers[0].self_attention.core_attention, SDPAttention)
    tree, _ = fork_pair(GROUPS, seed=1)
    la, ga = local.loss_and_grads(tree)
    lb, gb = sdpa.loss_and_grads(tree)
    assert abs(la - lb) <= TOL * abs(la)
    assert max(rel(gb[n], ga[n]) for n in ga) <= TOL


@pytest.mark.parametrize("layout", [dict(split_trees=False), dict(micro_batch_tokens=1)])
def test_splitting_trees_and_micro_batching_do_not_change_loss_or_gradients(make_trainer, layout):
    tree, _ = fork_pair(GROUPS + GROUPS, seed=2)
    whole = make_trainer(micro_batch_tokens=None)
    other = make_trainer(**layout)
    la, ga = whole.loss_and_grads(tree)
    lb, gb = other.loss_and_grads(tree)
    assert abs(la - lb) <= TOL * abs(lb)
    assert max(rel(ga[n], gb[n]) for n in gb) <= TOL


def branch_logits(trainer, batch):
    """Logits at each trained token's predicting position, keyed by (group path tokens up to that token)."""
    from gyre_hpc.train.model import forward_logits
    from gyre_hpc.trajectory.collate import to_tensors

    t = to_tensors(batch)
    with torch.no_grad():
        logits = forward_logits(trainer.model, t["input_ids"], t["position_ids"], t["attention_mask"])
    out = {}
    for r in range(batch.shape[0]):
        for i in range(int(batch.lengths[r])):
            path, j = [], i
            while j >= 0:
                path.append(int(batch.input_ids[r, j]))
                j = int(batch.parent[r, j])
            out[tuple(reversed(path))] = logits[r, i]
    return out


@pytest.mark.parametrize("position_embedding", ["mrope", "learned_absolute"])
def test_tree_row_logits_equal_separate_sequences(make_trainer, position_embedding):
    trainer = make_trainer(position_embedding)
    tree, flat = fork_pair(GROUPS, seed=3)
    lt, lf = branch_logits(trainer, tree), branch_logits(trainer, flat)
    assert set(lt) == set(lf) and len(lt) == tree.tokens
    assert max(float((lt[k] - lf[k]).abs().max()) for k in lf) < 1e-5


def test_a_causal_mask_on_the_tree_row_breaks_equality(make_trainer):
    """The check above can fail: attending the sibling branches (plain causal mask) changes branch logits."""
    from gyre_hpc.train.model import forward_logits
    from gyre_hpc.trajectory.collate import to_tensors

    trainer = make_trainer()
    tree, flat = fork_pair(GROUPS, seed=3)
    t = to_tensors(tree)
    L = tree.shape[1]
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1).expand(tree.shape[0], 1, L, L)
    with torch.no_grad():
        good = forward_logits(trainer.model, t["input_ids"], t["position_ids"], t["attention_mask"])
        bad = forward_logits(trainer.model, t["input_ids"], t["position_ids"], causal)
    second_branch = np.nonzero(tree.span_end[0] < tree.span_end[0, 0])[0][-1]  # a token of the last branch
    assert float((good[0, second_branch] - bad[0, second_branch]).abs().max()) > 1e-3


def test_tree_positions_matter_for_mrope(make_trainer):
    """mrope honours position ids (plain rope would ignore them): depth-based positions change the logits."""
    from gyre_hpc.train.model import forward_logits
    from gyre_hpc.trajectory.collate import to_tensors

    trainer = make_trainer("mrope")
    tree, _ = fork_pair(GROUPS, seed=3)
    t = to_tensors(tree)
    linear = torch.arange(tree.shape[1]).expand_as(t["position_ids"])
    assert not torch.equal(linear, t["position_ids"])
    with torch.no_grad():
        a = forward_logits(trainer.model, t["input_ids"], t["position_ids"], t["attention_mask"])
        b = forward_logits(trainer.model, t["input_ids"], linear, t["attention_mask"])
    assert float((a - b).abs().max()) > 1e-3


def loss_scale(trainer, batch) -> float:
    """Σ m |A| |logp| / Z: the size of the terms the loss sums (a group-normalised loss nearly cancels)."""
    import dataclasses

    return trainer.loss_and_grads(dataclasses.replace(batch, advantage=np.abs(batch.advantage)))[0]


@pytest.mark.parametrize("split_trees", [True, False])
def test_synthetic_agent_logs_tree_and_flat_give_same_loss_and_gradients(make_trainer, split_trees):
    """End to end: synthetic branching TITO log → real packers (both modes) → real megatron step."""
    from gyre_hpc.config import TrajectoryConfig
    from gyre_hpc.trajectory.pipeline import build_batch
    from gyre_hpc.trajectory.synth import synth_log

    log = synth_log(3, 4, seed=11, retry_prob=0.4)
    cfg = TrajectoryConfig(max_row_tokens=1024)
    tree, report = build_batch(log, cfg, "tree")
    flat, _ = build_batch(log, cfg, "flat")
    assert report.tree_tokens < 0.9 * report.flat_tokens and tree.trained_tokens == flat.trained_tokens
    assert tree.shape[0] < int((tree.parent < 0).sum())  # rows hold several run trees
    trainer = make_trainer(split_trees=split_trees)
    lt, gt = trainer.loss_and_grads(tree)
    lf, gf = trainer.loss_and_grads(flat)
    assert abs(lt - lf) <= TOL * loss_scale(trainer, flat)
    assert max(rel(gt[n], gf[n]) for n in gf) <= TOL


def test_tree_core_attention_is_the_default_and_builds_no_square_tensor(make_trainer, monkeypatch):
    """A 1,320-token tree row (128-token tiles) through forward and backward: no tensor anywhere holds T x T elements (the largest
    is one attention tile or the logits), and the result equals the dense local attention."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from gyre_hpc.config import ModelConfig
    from gyre_hpc.train.attention import TreeAttention
    from gyre_hpc.train import tree_attention

    monkeypatch.setattr(tree_attention, "BLOCK", 128)
    assert ModelConfig().attention == "tree"
    tree_t = make_trainer()
    assert all(isinstance(layer.self_attention.core_attention, TreeAttention) for layer in tree_t.model.decoder.layers)
    tree, _ = fork_pair([(8, 200, [300, 250, 280, 290], 1.0)], seed=3)
    T = tree.shape[1]
    assert T == 1320

    class Biggest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Biggest.numel = max(Biggest.numel, t.numel())
            return out

    with Biggest():
        la, ga = tree_t.loss_and_grads(tree)
    assert 0 < Biggest.numel < T * T / 2, (Biggest.numel, T)
    lb, gb = make_trainer(attention="local").loss_and_grads(tree)
    assert abs(la - lb) <= TOL * abs(lb)
    assert max(rel(ga[n], gb[n]) for n in gb) <= TOL


@pytest.mark.parametrize("memory", [dict(logits_chunk_tokens=3), dict(logits_chunk_tokens=5, recompute=True),
                                    dict(recompute=True, logits_chunk_tokens=None, split_trees=False)])
def test_chunked_output_layer_and_recomputation_do_not_change_loss_or_gradients(make_trainer, memory):
    """The output layer + log-probabilities in chunks of a few trained tokens (recomputed in the backward), and
    per-layer activation recomputation, against one pass over full logits without recomputation."""
    tree, flat = fork_pair(GROUPS, seed=5)
    whole = make_trainer(logits_chunk_tokens=None)
    chunked = make_trainer(**memory)
    if memory.get("recompute"):
        assert all(layer._gyre_recompute for layer in chunked.model.decoder.layers)
    la, ga = whole.loss_and_grads(tree)
    lb, gb = chunked.loss_and_grads(flat)
    assert abs(la - lb) <= TOL * abs(la)
    assert set(ga) == set(gb) and max(rel(gb[n], ga[n]) for n in ga) <= TOL
