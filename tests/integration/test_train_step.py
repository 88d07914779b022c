"""The Trainer on a real megatron GPTModel: learning, losses, bad input, bursts, state, export, checkpoints."""
import json

import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = pytest.mark.megatron

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], 0.5), (3, 4, [6], 0.7)]


@pytest.fixture(scope="module")
def make_trainer():
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.step import Trainer

    torch.set_num_threads(1)

    def make(seed=0, model=None, **train):
        return Trainer(ModelConfig(**(model or {})), TrainConfig(**train), seed=seed)

    return make


def test_training_on_a_fixed_batch_decreases_the_loss(make_trainer):
    trainer = make_trainer(lr=3e-3)
    tree, _ = fork_pair(GROUPS, seed=4)
    losses = [trainer.step(tree)["loss"] for _ in range(15)]
    assert losses[-1] < 0.8 * losses[0]
    assert trainer.version == 15


def test_step_metrics_describe_the_batch(make_trainer):
    trainer = make_trainer()
    tree, _ = fork_pair(GROUPS, seed=4)
    m = trainer.step(tree)
    assert m["trained_tokens"] == tree.trained_tokens and m["tokens"] == tree.tokens
    assert m["mean_logp"] < 0 and 0 < m["entropy"] <= np.log(256) + 1e-4
    assert m["grad_norm"] > 0 and m["version"] == 1 and m["step_time_s"] > 0


def test_pg_loss_is_minus_advantage_weighted_mean_logp(make_trainer):
    trainer = make_trainer()
    tree, _ = fork_pair([(1, 4, [3, 2], 1.0), (2, 5, [4], 1.0)], seed=5)
    m = trainer._accumulate(tree)
    assert m["loss"] == pytest.approx(-m["mean_logp"], rel=1e-6)


def grad_norm(trainer):
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in trainer.model.parameters())))


def test_grad_clip_scales_the_gradient_to_the_clip_norm(make_trainer):
    tree, _ = fork_pair(GROUPS, seed=4)
    clipped, free = make_trainer(grad_clip=1e-3), make_trainer(grad_clip=None)
    for t in (clipped, free):
        t._accumulate(tree)
    raw = grad_norm(free)
    assert free.clip_grads() == pytest.approx(raw, rel=1e-6) and grad_norm(free) == raw
    assert clipped.clip_grads() == pytest.approx(raw, rel=1e-6) and raw > 1e-3
    assert grad_norm(clipped) == pytest.approx(1e-3, rel=1e-4)


def test_ppo_on_policy_has_the_pg_gradient(make_trainer):
    from gyre_hpc.train.loss import gather_logprobs
    from gyre_hpc.train.model import forward_logits
    from gyre_hpc.trajectory.collate import to_tensors

    pg, ppo = make_trainer(loss="pg"), make_trainer(loss="ppo")
    tree, _ = fork_pair(GROUPS, seed=6)
    t = to_tensors(tree)
    with torch.no_grad():
        logits = forward_logits(ppo.model, t["input_ids"], t["position_ids"], t["attention_mask"])
        logp, _, (r, c) = gather_logprobs(logits, t["parent"], t["input_ids"], t["loss_mask"] > 0)
    old = tree.old_logprob.copy()
    old[r.numpy(), c.numpy()] = logp.numpy()
    import dataclasses

    on_policy = dataclasses.replace(tree, old_logprob=old)
    _, g_pg = pg.loss_and_grads(on_policy)
    _, g_ppo = ppo.loss_and_grads(on_policy)
    assert max(float((g_pg[n] - g_ppo[n]).norm() / g_pg[n].norm()) for n in g_pg) < 1e-5


def test_ppo_clipped_tokens_give_no_gradient(make_trainer):
    """Positive advantage and a ratio far above 1 + eps: every token is clipped, so nothing is learned."""
    trainer = make_trainer(loss="ppo", clip_eps=0.2)
    tree, _ = fork_pair(GROUPS, seed=7, old_logprob=-50.0)  # ratio = exp(logp + 50) >> 1.2
    loss, grads = trainer.loss_and_grads(tree)
    assert loss == pytest.approx(-1.2 * float((tree.advantage * tree.loss_mask).sum() / tree.loss_mask.sum()))
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())
    m = trainer._accumulate(tree)
    assert m["clip_frac"] == 1.0 and m["approx_kl"] == pytest.approx(-50.0 - m["mean_logp"], rel=1e-5)


def test_bad_batches_are_refused_with_trajectory_errors(make_trainer):
    import dataclasses

    from gyre_hpc.errors import TrajectoryError

    trainer = make_trainer()
    tree, _ = fork_pair(GROUPS, seed=8)
    ids = tree.input_ids.copy()
    ids[0, 1] = 256
    with pytest.raises(TrajectoryError, match="token id 256 outside the vocabulary of model.vocab_size=256"):
        trainer.step(dataclasses.replace(tree, input_ids=ids))
    with pytest.raises(TrajectoryError, match="no trained token"):
        trainer.step(dataclasses.replace(tree, loss_mask=np.zeros_like(tree.loss_mask)))
    with pytest.raises(TrajectoryError, match=r"no trained token left below model.max_seq_len=512 after "
                                              r"train.overlong=cut \(deepest position id 1100\)"):
        trainer.step(dataclasses.replace(tree, position_ids=tree.position_ids + 1100 - tree.position_ids.max()))
    assert trainer.version == 0


@pytest.mark.parametrize("rule", ["cut", "drop"])
def test_paths_beyond_max_seq_len_are_cut_or_dropped_and_counted_never_crashing_the_step(rule):
    """A path longer than model.max_seq_len: ``cut`` trains the rest exactly as a model with room for the whole
    path whose tail is not trained; ``drop`` leaves its tree out. Tree and flat packings cut alike (cut)."""
    import dataclasses

    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.step import Trainer

    groups = [(2, 5, [3, 9, 2], 1.0), (1, 6, [2, 5], -0.5)]
    trainer = Trainer(ModelConfig(max_seq_len=12, kv_heads=2), TrainConfig(overlong=rule), seed=0)
    tree, flat = fork_pair(groups, seed=4)
    assert tree.position_ids.max() == 13
    mt, grads_t, _ = trainer.group_grads(tree)
    mf, grads_f, _ = trainer.group_grads(flat)
    assert mt["trained_tokens"] == tree.trained_tokens - mt["overlong_trained_tokens_cut"]
    if rule == "cut":
        assert (mt["overlong_tokens_cut"], mt["overlong_trained_tokens_cut"]) == (2.0, 2.0)
        assert mf["overlong_tokens_cut"] == 2.0
        roomy = Trainer(ModelConfig(max_seq_len=14, kv_heads=2), TrainConfig(), seed=0)
        untrained_tail = dataclasses.replace(tree, loss_mask=np.where(tree.position_ids >= 12, 0, tree.loss_mask))
        mr, grads_r, _ = roomy.group_grads(untrained_tail)
        assert mr["loss"] == pytest.approx(mt["loss"], rel=1e-5) and mf["loss"] == pytest.approx(mt["loss"], rel=1e-5)
        for n in grads_r:
            assert float((grads_t[n] - grads_r[n]).norm()) <= 1e-5 * float(grads_r[n].norm()) + 1e-12
            assert float((grads_f[n] - grads_r[n]).norm()) <= 1e-5 * float(grads_r[n].norm()) + 1e-12
    else:
        assert mt["overlong_tokens_cut"] == 5 + 3 + 9 + 2 and mf["overlong_tokens_cut"] == 5 + 9
    assert trainer.step(tree)["version"] == 1


def test_burst_makes_mu_ordered_steps(make_trainer):
    from gyre_hpc.errors import TrajectoryError
    from gyre_hpc.train.step import split_rows

    tree, flat = fork_pair(GROUPS, seed=9)
    parts = split_rows(flat, 2)
    assert [p.shape[0] for p in parts] == [3, 3]
    assert np.array_equal(np.concatenate([p.input_ids for p in parts]), flat.input_ids)
    trainer = make_trainer()
    metrics = trainer.burst(tree, 3)
    assert [m["version"] for m in metrics] == [1, 2, 3] and trainer.version == 3
    assert sum(m["trained_tokens"] for m in metrics) == tree.trained_tokens
    with pytest.raises(TrajectoryError, match=r"3 rows into 4 optimizer steps \(scheduler.mu\)"):
        make_trainer().burst(tree, 4)


def test_same_seed_same_weights_other_seed_other_weights(make_trainer):
    a, b, c = make_trainer(seed=3).export_weights(), make_trainer(seed=3).export_weights(), make_trainer(seed=4).export_weights()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embedding.word_embeddings.weight"], c["embedding.word_embeddings.weight"])


def test_export_weights_are_flat_cpu_copies_that_rebuild_the_model(make_trainer):
    trainer = make_trainer()
    tree, _ = fork_pair(GROUPS, seed=10)
    trainer.step(tree)
    weights = trainer.export_weights()
    params = dict(trainer.model.named_parameters())
    assert set(weights) == set(params)
    assert all(w.device.type == "cpu" and torch.equal(w, params[k].detach().cpu()) for k, w in weights.items())
    weights["output_layer.weight"].add_(1.0)  # a copy: the model is untouched
    assert not torch.equal(weights["output_layer.weight"], params["output_layer.weight"].detach())
    fresh = make_trainer(seed=99)
    fresh.model.load_state_dict(trainer.export_weights(), strict=False)
    la, _ = trainer.loss_and_grads(tree)
    lb, _ = fresh.loss_and_grads(tree)
    assert la == lb


def test_checkpoint_round_trip_continues_training_identically(make_trainer, tmp_path):
    tree, flat = fork_pair(GROUPS, seed=11)
    a = make_trainer()
    a.step(tree)
    path = a.save_checkpoint(tmp_path / "ckpt")
    assert json.loads((path / "meta.json").read_text()) == {"version": 1, "tensor_parallel": 1, "world_size": 1,
                                                           "distributed_optimizer": False, "expert_parallel": 1}
    next_a = a.step(flat)["loss"]
    b = make_trainer(seed=5)
    b.load_checkpoint(path)
    assert b.version == 1
    assert b.step(flat)["loss"] == next_a
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_a_failed_save_leaves_the_previous_checkpoint_whole(make_trainer, tmp_path, monkeypatch):
    from gyre_hpc.train import checkpoint

    trainer = make_trainer()
    tree, _ = fork_pair(GROUPS, seed=12)
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    trainer.step(tree)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    state, meta = checkpoint.load(path)
    assert meta["version"] == 0 and state["version"] == 0


def test_loading_a_missing_checkpoint_is_a_checkpoint_error(make_trainer, tmp_path):
    from gyre_hpc.errors import CheckpointError

    with pytest.raises(CheckpointError, match="no meta.json"):
        make_trainer().load_checkpoint(tmp_path / "nothing")
