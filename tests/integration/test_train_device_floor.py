"""The emulated training device (``train.device_token_s``, gyre_hpc/live/training_side.py ``_Side.grads``): a
group's forward/backward lasts at least device_token_s x its trained tokens on the side's clock, and the floor
changes the time only, never the gradients. Real megatron trainers on a ``ManualClock``: the computation itself
takes no virtual time, so the clock moves by exactly the floor."""
import numpy as np
import pytest

from train_batches import fork_pair

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5)]


def trainer(tmp_path_factory, device_token_s):
    from gyre_hpc.clock import ManualClock
    from gyre_hpc.config import load_config
    from gyre_hpc.live.training_side import CoreTrainer

    cfg = load_config("configs/local.yaml", ["transfer.backend=inprocess", f"train.device_token_s={device_token_s}"])
    return CoreTrainer(tmp_path_factory.mktemp("run"), model=cfg.model, train=cfg.train, transfer=cfg.transfer,
                       seed=cfg.run.seed, clock=ManualClock())


@pytest.fixture(scope="module")
def paced_and_plain(tmp_path_factory):
    paced, plain = trainer(tmp_path_factory, 0.25), trainer(tmp_path_factory, 0.0)
    yield paced, plain
    paced.close()
    plain.close()


def test_a_group_takes_the_floor_per_trained_token_and_the_same_gradients(paced_and_plain):
    from gyre_hpc.live import dataplane as dp

    paced, plain = paced_and_plain
    tree, _ = fork_pair(GROUPS, seed=3, old_logprob=-5.0)
    g = dp.Group(gid=0, batch=tree, trained_tokens=tree.trained_tokens)
    t0 = paced.clock.now()
    z, grads, loss, _ = paced.grads(g)
    assert z == tree.trained_tokens > 0
    assert paced.clock.now() - t0 == pytest.approx(0.25 * z)
    t1 = plain.clock.now()
    z_plain, grads_plain, loss_plain, _ = plain.grads(g)
    assert plain.clock.now() == t1  # off: no virtual time at all
    assert (z_plain, loss_plain) == (z, loss)
    assert all(np.array_equal(grads[k], grads_plain[k]) for k in grads)


def test_a_negative_floor_fails_at_load_with_the_dotted_key():
    from gyre_hpc.config import load_config
    from gyre_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match="train.device_token_s"):
        load_config("configs/local.yaml", ["train.device_token_s=-1"])
