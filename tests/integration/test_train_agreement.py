"""Train-inference agreement and truncated importance sampling in the real megatron Trainer.

The first forward of a step compares the engine's logprobs with the trainer's on the tokens generated at the
trainer's version; a later epoch weighs each token against that first forward (its TIS weight and its ppo ratio).
"""
import dataclasses

import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = pytest.mark.megatron

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5), (3, 4, [6], 0.7)]


@pytest.fixture(scope="module")
def make_trainer():
    from gyre_hpc.config import ModelConfig, TrainConfig
    from gyre_hpc.train.step import Trainer

    torch.set_num_threads(1)
    return lambda **train: Trainer(ModelConfig(), TrainConfig(**train), seed=0)


def test_first_forward_compares_only_the_tokens_generated_at_the_trainers_version(make_trainer):
    trainer = make_trainer(split_trees=True, micro_batch_tokens=16)  # several parts: positions map back
    tree, _ = fork_pair(GROUPS, seed=3)
    _, mine = trainer.forward_backward(tree)
    trained = tree.loss_mask > 0
    version = np.where(trained, 0, -1)
    version[0, np.flatnonzero(trained[0])[:3]] = 7  # three stale tokens, far off: never compared
    engine = np.where(trained, mine + 0.25, 0.0).astype(np.float32)
    engine[version == 7] -= 5.0
    batch = dataclasses.replace(tree, old_logprob=engine, version=version)
    m = trainer.step(batch)
    assert m["logprob_abs_diff_tokens"] == int(trained.sum()) - 3
    assert m["logprob_abs_diff_mean"] == pytest.approx(0.25, abs=1e-4)
    assert m["logprob_abs_diff_max"] == pytest.approx(0.25, abs=1e-4)
    m = trainer.step(batch)  # now at version 1: no token of version 0 qualifies
    assert m["logprob_abs_diff_tokens"] == 0 and m["logprob_abs_diff_mean"] is None


def test_a_later_epoch_weighs_every_token_against_its_first_forward_logprob(make_trainer):
    cap = 1.5
    trainer = make_trainer(loss="ppo", tis_cap=cap, lr=1e-2)
    tree, _ = fork_pair(GROUPS, seed=4)
    rng = np.random.default_rng(0)
    trained = tree.loss_mask > 0
    first, mine = trainer.forward_backward(tree)
    engine = np.where(trained, mine + rng.normal(0, 0.5, mine.shape), 0).astype(np.float32)
    batch = dataclasses.replace(tree, old_logprob=engine)
    first, mine = trainer.forward_backward(batch)
    w = np.minimum(np.exp(mine[trained].astype(np.float64) - engine[trained]), cap)
    assert first["tis_weight_mean"] == pytest.approx(w.mean(), rel=1e-5) and first["approx_kl"] == 0.0
    assert 0 < first["tis_truncated_frac"] < 1
    trainer.clip_grads()
    trainer.optimizer.step()  # the step's first update: the weights move, the reference stays
    later, _ = trainer.forward_backward(batch, mine)
    assert later["tis_weight_mean"] == pytest.approx(w.mean(), rel=1e-5)
    assert abs(later["approx_kl"]) > 1e-4  # the ratio is taken against the first forward, not the new weights
    assert "logprob_abs_diff_mean" not in later  # agreement is measured once per step, before any update
    fresh, _ = trainer.forward_backward(batch)
    assert fresh["approx_kl"] == 0.0 and fresh["tis_weight_mean"] != pytest.approx(w.mean(), rel=1e-5)


@pytest.mark.parametrize("loss", ["pg", "ppo"])
def test_tree_and_flat_packings_give_the_same_tis_loss_and_gradients(make_trainer, loss):
    """A shared token is trained once with its one engine logprob in either packing, so TIS keeps the equality."""
    from gyre_hpc.config import TrajectoryConfig
    from gyre_hpc.trajectory.pipeline import build_batch
    from gyre_hpc.trajectory.synth import synth_log

    log = synth_log(3, 4, seed=11, retry_prob=0.4)
    tree, report = build_batch(log, TrajectoryConfig(max_row_tokens=1024), "tree")
    flat, _ = build_batch(log, TrajectoryConfig(max_row_tokens=1024), "flat")
    assert report.tree_tokens < 0.9 * report.flat_tokens
    trainer = make_trainer(loss=loss, tis_cap=1.2)
    (mt, gt, _), (mf, gf, _) = trainer.group_grads(tree), trainer.group_grads(flat)
    assert 0 < mt["tis_truncated_frac"] == pytest.approx(mf["tis_truncated_frac"])
    assert mt["loss"] == pytest.approx(mf["loss"], rel=1e-4, abs=1e-5)
    assert max(float((gt[n] - gf[n]).norm() / gf[n].norm()) for n in gf) <= 1e-5
    plain = make_trainer(loss=loss)
    assert plain.loss_and_grads(tree)[0] != pytest.approx(mt["loss"], rel=1e-3)  # the weights are not all 1
