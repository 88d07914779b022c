"""Gradient buffers (gyre_hpc/transfer/gradients.py): what the core pulls is what the satellite wrote, segments are
never overwritten while the core may still need them, and a satellite that left makes a pull fail, never hang.
Real publishers and pullers (in-process memcpy and loopback TCP sockets)."""
import pickle

import numpy as np
import pytest

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.gradients import GradientReceiver, GradientSender

SHAPES = {"embed.weight": (16, 8), "layers.0.bias": (3,), "head.weight": (8, 16)}


def grads(seed: int, names=tuple(SHAPES)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(SHAPES[n]).astype(np.float32) for n in names}


@pytest.fixture(params=["inprocess", "socket"])
def pair(request):
    cfg = TransferConfig(backend=request.param, checksum="crc32", checksum_chunk_bytes=256)
    sender, receiver = GradientSender(cfg, SHAPES, slots=2), GradientReceiver(cfg)
    yield sender, receiver
    receiver.close()
    sender.close()


def test_the_core_pulls_bit_identical_gradients_in_the_models_order(pair):
    sender, receiver = pair
    sent = grads(1)
    reordered = {n: sent[n] for n in reversed(list(sent))}
    got, stats = receiver.pull(sender.publish(reordered, version=0, gid=7).to_dict())
    assert list(got) == list(SHAPES)  # the model's order, whatever order the dict had
    assert all(np.array_equal(got[n], sent[n]) and got[n].dtype == np.float32 for n in sent)
    assert stats.checksum_ok is True and stats.bytes > sum(a.nbytes for a in sent.values())


def test_a_parameter_without_a_gradient_stays_absent(pair):
    sender, receiver = pair
    got, _ = receiver.pull(sender.publish(grads(2, ("head.weight",)), version=0, gid=1).to_dict())
    assert set(got) == {"head.weight"}


def test_two_groups_of_one_version_live_side_by_side(pair):
    sender, receiver = pair
    a, b = grads(3), grads(4)
    da = sender.publish(a, version=5, gid=0).to_dict()
    db = sender.publish(b, version=5, gid=1).to_dict()
    got_b, _ = receiver.pull(db)
    assert np.array_equal(got_b["embed.weight"], b["embed.weight"])
    got_a, _ = receiver.pull(da)  # the first group is still there after the second was written
    assert np.array_equal(got_a["embed.weight"], a["embed.weight"])


def test_more_groups_in_one_version_than_slots_is_refused_not_overwritten(pair):
    sender, receiver = pair
    sender.publish(grads(5), version=0, gid=0)
    sender.publish(grads(6), version=0, gid=1)
    with pytest.raises(TransferError, match="more than 2 groups of version 0"):
        sender.publish(grads(7), version=0, gid=2)


def test_a_newer_version_frees_the_slots_and_an_older_one_is_refused(pair):
    sender, receiver = pair
    old = sender.publish(grads(5), version=0, gid=0).to_dict()
    sender.publish(grads(6), version=0, gid=1)
    new = grads(8)
    desc = sender.publish(new, version=1, gid=2).to_dict()
    assert np.array_equal(receiver.pull(desc)[0]["head.weight"], new["head.weight"])
    with pytest.raises(TransferError, match="stale descriptor"):  # its segment now holds version 1's group
        receiver.pull(old)
    with pytest.raises(TransferError, match="version 0 after version 1"):
        sender.publish(grads(9), version=0, gid=3)


def test_a_rewritten_segment_is_reported_stale_never_returned(pair):
    sender, receiver = pair
    first = sender.publish(grads(10), version=0, gid=4).to_dict()
    second = sender.publish(grads(11), version=0, gid=4).to_dict()  # the same group handed out again
    with pytest.raises(TransferError, match="stale descriptor"):
        receiver.pull(first)
    assert np.array_equal(receiver.pull(second)[0]["layers.0.bias"], grads(11)["layers.0.bias"])


def test_a_pull_from_a_satellite_that_left_fails_instead_of_hanging(pair):
    sender, receiver = pair
    desc = sender.publish(grads(12), version=0, gid=0).to_dict()
    sender.close()
    with pytest.raises(TransferError):
        receiver.pull(desc)


def test_the_descriptor_that_travels_holds_no_array_and_is_small():
    cfg = TransferConfig(backend="inprocess")
    shapes = {f"layers.{i}.weight": (256, 256) for i in range(8)}  # 2 MiB of gradients
    with GradientReceiver(cfg) as receiver, GradientSender(cfg, shapes, slots=1) as sender:
        g = {n: np.ones(s, np.float32) for n, s in shapes.items()}
        desc = sender.publish(g, version=0, gid=0).to_dict()
        assert len(pickle.dumps(desc)) < 4096
        assert "ndarray" not in repr(desc) and receiver.pull(desc)[1].checksum_ok
