"""Truncated importance sampling on tiny tensors: the weights, the cap, and what they do to the gradient."""
import math

import pytest
import torch

from gyre_hpc.train.loss import policy_loss, tis_weights

pytestmark = pytest.mark.megatron  # needs torch

ENGINE = torch.tensor([-1.0, -2.0, -0.5, -3.0])
TRAINER = torch.tensor([-1.0, -1.0, -1.5, -0.5])  # ratios exp(0)=1, exp(1)=2.72, exp(-1)=0.37, exp(2.5)=12.2


def test_weights_are_the_trainer_engine_ratio_truncated_at_the_cap():
    w = tis_weights(TRAINER, ENGINE, cap=2.0)
    assert w.tolist() == pytest.approx([1.0, 2.0, math.exp(-1.0), 2.0])
    assert tis_weights(TRAINER, ENGINE, cap=100.0).tolist() == pytest.approx(torch.exp(TRAINER - ENGINE).tolist())
    assert tis_weights(torch.tensor([0.0]), torch.tensor([-1e4]), cap=3.0).item() == 3.0  # overflow: the cap


def test_pg_gradient_of_each_token_is_scaled_by_exactly_its_weight():
    adv, mask = torch.tensor([1.0, -1.0, 2.0, 0.5]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    w = tis_weights(TRAINER, ENGINE, cap=2.0)
    logp = TRAINER.clone().requires_grad_(True)
    policy_loss(logp, adv, mask, 3.0, "pg", tis=w).backward()
    assert logp.grad.tolist() == pytest.approx((-adv * mask * w / 3.0).tolist())
    plain = TRAINER.clone().requires_grad_(True)
    policy_loss(plain, adv, mask, 3.0, "pg").backward()
    assert logp.grad[1].item() == pytest.approx(2.0 * plain.grad[1].item())  # truncated at the cap: twice
    assert logp.grad[2].item() == pytest.approx(math.exp(-1.0) * plain.grad[2].item())  # below 1: damped
    assert logp.grad[3] == 0.0  # an untrained token stays untrained


def test_ppo_with_tis_takes_its_ratio_against_the_trainers_old_logprob():
    adv, mask = torch.tensor([1.0, 1.0, -1.0, 1.0]), torch.ones(4)
    w = tis_weights(TRAINER, ENGINE, cap=2.0)
    logp = TRAINER.clone().requires_grad_(True)  # the first epoch: logp == trainer_old, every ratio 1
    loss = policy_loss(logp, adv, mask, 4.0, "ppo", old_logprob=TRAINER, clip_eps=0.2, tis=w)
    loss.backward()
    assert loss.item() == pytest.approx(float(-(w * adv).sum() / 4.0))
    assert logp.grad.tolist() == pytest.approx((-adv * w / 4.0).tolist())
    moved = (TRAINER + 0.5).requires_grad_(True)  # a later epoch: ratio e^0.5 > 1.2 clips positive advantages
    policy_loss(moved, adv, mask, 4.0, "ppo", old_logprob=TRAINER, clip_eps=0.2, tis=w).backward()
    assert moved.grad[[0, 1, 3]].abs().max() == 0.0 and moved.grad[2] != 0.0


def test_weights_of_one_change_nothing():
    adv, mask = torch.tensor([1.0, -1.0, 2.0, 0.5]), torch.ones(4)
    for kind in ("pg", "ppo"):
        a, b = TRAINER.clone().requires_grad_(True), TRAINER.clone().requires_grad_(True)
        la = policy_loss(a, adv, mask, 4.0, kind, old_logprob=ENGINE, tis=torch.ones(4))
        lb = policy_loss(b, adv, mask, 4.0, kind, old_logprob=ENGINE)
        la.backward(), lb.backward()
        assert la.item() == lb.item() and torch.equal(a.grad, b.grad)


def test_no_gradient_flows_through_the_weights():
    old = TRAINER.clone().requires_grad_(True)
    logp = TRAINER.clone().requires_grad_(True)
    policy_loss(logp, torch.ones(4), torch.ones(4), 4.0, "pg", tis=tis_weights(old, ENGINE, 2.0)).backward()
    assert old.grad is None and logp.grad is not None
