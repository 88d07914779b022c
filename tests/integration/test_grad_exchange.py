"""Gradients reach the core as tensors (gyre_hpc/live/training_side.py, gyre_hpc/transfer/gradients.py): the core's sum
over a satellite's pulled gradients is the single-process gradient of the same batch, the data-plane message holds
no gradient array, and a satellite that leaves mid-step (or dies) does not hang the core. Real megatron trainers,
real loopback TCP transfer (socket backend); the core and the satellite share this process."""
import multiprocessing as mp
import pickle
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from train_batches import fork_pair

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

GROUPS = [(2, 5, [3, 4, 2], 1.0), (1, 6, [2, 5], -0.5), (3, 4, [6], 0.7)]
OVERRIDES = ["transfer.backend=socket", "scheduler.batch_groups=2", "train.epochs=1", "train.loss=pg"]


def rows(batch, idx):
    """The packed rows ``idx`` of ``batch`` as a batch of their own (one group)."""
    return replace(batch, **{f.name: getattr(batch, f.name)[idx] for f in fields(batch)})


def group(gid, batch):
    from gyre_hpc.live import dataplane as dp

    return dp.Group(gid=gid, batch=batch, trained_tokens=batch.trained_tokens)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    from gyre_hpc.live.training_side import CoreTrainer, SatelliteTrainer
    from gyre_hpc.config import load_config

    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config("configs/local.yaml", OVERRIDES)
    sections = dict(model=cfg.model, train=cfg.train, transfer=cfg.transfer, seed=cfg.run.seed)
    core = CoreTrainer(run_dir, **sections)
    satellite = SatelliteTrainer(run_dir, **sections, slots=cfg.scheduler.batch_groups)
    satellite.ensure(0, timeout_s=60)
    yield core, satellite
    satellite.close()
    core.close()


def arrays_in(obj):
    """Every numpy array or torch tensor anywhere inside ``obj`` (dicts, lists, tuples)."""
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in arrays_in(v)]
    if isinstance(obj, (list, tuple)):
        return [a for v in obj for a in arrays_in(v)]
    return []


def satellite_message(satellite, version, g):
    from gyre_hpc.live import dataplane as dp

    z, grads, loss, extra = satellite.grads(g)
    return satellite.message(version, g, z, grads, loss, dp.lag_stats(g.batch, version), extra, 0.0), grads


def test_the_cores_sum_over_pulled_gradients_is_the_single_process_gradient_of_the_batch(cells):
    from gyre_hpc.live import dataplane as dp

    core, satellite = cells
    tree, _ = fork_pair(GROUPS, seed=1, old_logprob=-5.0)
    mine, theirs = group(0, rows(tree, [0, 1])), group(1, rows(tree, [2]))
    z_a, g_a, loss_a, extra_a = core.grads(mine)
    assert core.add(0, 0, z_a, g_a, loss_a, dp.lag_stats(mine.batch, 0), mine, extra_a)
    msg, g_b = satellite_message(satellite, 0, theirs)
    assert core.add_remote(msg)
    z_b = msg["z"]
    # bit-identical to today's road (the satellite's arrays summed as they were)
    assert set(core.acc) == set(g_a) | set(g_b)
    assert all(np.array_equal(core.acc[k], z_a * g_a[k] + z_b * g_b[k]) for k in core.acc)
    # the gradient of the whole batch's token-mean loss, computed in one process on the same weights
    _, whole = core.trainer.loss_and_grads(tree)
    assert core.z == tree.trained_tokens
    worst = max(float(np.linalg.norm(core.acc[k] / core.z - whole[k].numpy()) /
                      max(np.linalg.norm(whole[k].numpy()), 1e-30)) for k in whole)
    assert worst <= 1e-5, worst
    assert core.grad_pulls()["n"] >= 1 and core.grad_pulls()["bytes"] > sum(g.nbytes for g in g_b.values())
    core.reset_step()
    core.ledger = dp.GradLedger(core.version)


def test_the_data_plane_message_carrying_a_gradient_holds_no_array(cells):
    core, satellite = cells
    tree, _ = fork_pair(GROUPS, seed=2)
    msg, grads = satellite_message(satellite, 0, group(1, tree))  # group 1 again: its slot is reused
    assert grads and arrays_in(msg) == []
    assert len(pickle.dumps(msg)) < 8192 < sum(g.nbytes for g in grads.values())


def test_a_satellite_leaving_mid_step_costs_its_copy_not_the_step(cells):
    from gyre_hpc.live import dataplane as dp
    from gyre_hpc.transfer.gradients import GradientSender

    core, satellite = cells
    tree, _ = fork_pair(GROUPS, seed=3)
    g0, g1 = group(10, rows(tree, [0])), group(11, rows(tree, [1, 2]))
    shapes = {n: tuple(p.shape) for n, p in satellite.trainer.model.named_parameters()}
    msg, _ = satellite_message(satellite, 0, g1)
    satellite.sender.close()  # the satellite leaves after sending its header, before the core pulls
    satellite.sender = GradientSender(satellite.transfer, shapes, slots=2)  # (for the module's teardown)
    assert core.add_remote(msg) is False
    assert core.ledger.dropped[-1]["why"] == "pull failed" and core.ledger.dropped[-1]["gid"] == 11
    for g in (g0, g1):  # the hub re-issues the lost group: here to the core itself
        z, grads, loss, extra = core.grads(g)
        assert core.add(0, g.gid, z, grads, loss, dp.lag_stats(g.batch, 0), g, extra)
    rec = core.step()
    assert rec["version"] == 1 and rec["gids"] == [10, 11] and rec["trained_tokens"] == tree.trained_tokens


def _publish_and_wait(conn):
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.transfer.gradients import GradientSender

    sender = GradientSender(TransferConfig(backend="socket"), {"w": (1024, 256)}, slots=1)
    conn.send(sender.publish({"w": np.ones((1024, 256), np.float32)}, version=0, gid=0).to_dict())
    conn.recv()  # killed while waiting here


def test_a_pull_from_a_killed_satellite_process_fails_at_once():
    from gyre_hpc.config import TransferConfig
    from gyre_hpc.errors import TransferError
    from gyre_hpc.transfer.gradients import GradientReceiver

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_publish_and_wait, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "the satellite process published nothing"
        desc = parent.recv()
        with GradientReceiver(TransferConfig(backend="socket", timeout_s=30)) as receiver:
            assert receiver.pull(desc)[0]["w"].sum() == 1024 * 256  # alive: the pull works
            proc.kill()
            proc.join(timeout=30)
            receiver.puller._drop(desc["location"])  # a fresh connection, as the core's next pull would make
            with pytest.raises(TransferError, match="socket read failed"):
                receiver.pull(desc)
    finally:
        if proc.is_alive():
            proc.kill()
