"""The shared publish/pull flow, exercised through the in-process stand-in (no wire, same contract)."""
import dataclasses
import json
import multiprocessing as mp

import numpy as np
import pytest

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer import WeightDescriptor, WeightPublisher, WeightPuller, make_publisher, make_puller
from gyre_hpc.transfer.base import HEADER_BYTES, plan_chunks

CFG = TransferConfig(backend="inprocess", chunk_bytes=1000, batch_bytes=3000, checksum_chunk_bytes=512)


def model(seed=0, rows=64):
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((rows, 32)).astype(np.float32),
            "bias": rng.integers(0, 100, 17).astype(np.int64)}


@pytest.fixture
def pair():
    with make_publisher(CFG) as publisher, make_puller(CFG) as puller:
        yield publisher, puller


def test_pull_returns_the_published_bytes_and_stats(pair):
    publisher, puller = pair
    assert isinstance(publisher, WeightPublisher) and isinstance(puller, WeightPuller)
    w = model()
    desc = publisher.publish(w, version=1)
    got, stats = puller.pull(desc)
    for name in w:
        np.testing.assert_array_equal(got[name], w[name])
    assert stats.version == 1 and stats.checksum_ok is True and stats.backend == "inprocess"
    assert stats.bytes == HEADER_BYTES + desc.manifest.total_bytes and stats.checksum == desc.manifest.checksum


def test_second_version_replaces_the_first(pair):
    publisher, puller = pair
    publisher.publish(model(0), version=1)
    desc2 = publisher.publish(model(1), version=2)
    got, stats = puller.pull(desc2)
    np.testing.assert_array_equal(got["embed"], model(1)["embed"])
    assert stats.version == 2


def test_descriptor_of_an_overwritten_version_is_reported_stale(pair):
    publisher, puller = pair
    old = publisher.publish(model(0), version=1)
    publisher.publish(model(1), version=2)
    with pytest.raises(TransferError, match="stale descriptor: .* now serves version 2; .* for version 1"):
        puller.pull(old)


def test_descriptor_during_a_rewrite_is_reported_stale(pair):
    publisher, puller = pair
    desc = publisher.publish(model(0), version=1)
    publisher.buffer[8:16] = np.array([-1], dtype="<i8").view(np.uint8)  # the header a rewrite starts with
    with pytest.raises(TransferError, match="is rewriting its buffer"):
        puller.pull(desc)


def test_corrupted_bytes_are_caught_by_the_checksum_and_named(pair):
    publisher, puller = pair
    desc = publisher.publish(model(), version=1)
    bias = next(e for e in desc.manifest.tensors if e.name == "bias")
    publisher.buffer[HEADER_BYTES + bias.offset + 5] ^= 0x10
    with pytest.raises(TransferError, match=r"checksum mismatch in 1 of \d+ chunks .* damaged tensors: bias"):
        puller.pull(desc)


def test_without_verification_checksum_ok_is_none():
    cfg = dataclasses.replace(CFG, verify=False)
    with make_publisher(cfg) as publisher, make_puller(cfg) as puller:
        _, stats = puller.pull(publisher.publish(model(), version=0))
    assert stats.checksum_ok is None


def test_address_outside_the_buffer_fails(pair):
    publisher, puller = pair
    desc = publisher.publish(model(), version=1)
    forged = dataclasses.replace(desc, address=desc.address + len(publisher.buffer))
    with pytest.raises(TransferError, match="outside the published buffer"):
        puller.pull(forged)


def test_growing_weights_invalidate_old_addresses(pair):
    publisher, puller = pair
    small = publisher.publish(model(rows=8), version=1)
    big = publisher.publish(model(rows=4000), version=2)
    assert big.address != small.address
    with pytest.raises(TransferError, match="outside the published buffer"):
        puller.pull(small)
    got, _ = puller.pull(big)
    assert got["embed"].shape == (4000, 32)


def test_versions_must_increase(pair):
    publisher, _ = pair
    publisher.publish(model(), version=3)
    with pytest.raises(TransferError, match="version must increase, got 3 after 3"):
        publisher.publish(model(), version=3)
    with pytest.raises(TransferError, match="non-negative integer"):
        publisher.publish(model(), version=-2)


def test_closed_publisher_cannot_be_read(pair):
    publisher, puller = pair
    desc = publisher.publish(model(), version=1)
    publisher.close()
    with pytest.raises(TransferError, match="no in-process publisher at inprocess:"):
        puller.pull(desc)
    with pytest.raises(TransferError, match="is closed"):
        publisher.publish(model(), version=2)


def test_puller_rejects_another_backends_descriptor(pair):
    publisher, puller = pair
    desc = dataclasses.replace(publisher.publish(model(), version=1), backend="mooncake")
    with pytest.raises(TransferError, match="inprocess puller cannot read a mooncake descriptor"):
        puller.pull(desc)


def test_descriptor_is_plain_json_and_round_trips(pair):
    publisher, puller = pair
    desc = publisher.publish(model(), version=5)
    again = WeightDescriptor.from_dict(json.loads(json.dumps(desc.to_dict())))
    assert again == desc
    got, _ = puller.pull(again)
    np.testing.assert_array_equal(got["bias"], model()["bias"])
    with pytest.raises(TransferError, match="descriptor: expected keys"):
        WeightDescriptor.from_dict({"backend": "inprocess"})


def _use_after_fork(puller, desc, queue):
    try:
        puller.pull(desc)
        queue.put("pulled")
    except TransferError as exc:
        queue.put(str(exc))


def test_use_after_fork_is_refused(pair):
    publisher, puller = pair
    desc = publisher.publish(model(), version=1)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_use_after_fork, args=(puller, desc, queue))
    child.start()
    message = queue.get(timeout=30)
    child.join(timeout=30)
    assert "after a fork" in message


@pytest.mark.parametrize("total, chunk, batch", [(0, 4, 8), (1, 4, 8), (10, 4, 8), (16, 4, 4), (17, 5, 3)])
def test_chunk_plan_covers_every_byte_once_in_order(total, chunk, batch):
    batches = plan_chunks(total, chunk, batch)
    flat = [c for b in batches for c in b]
    assert [off for off, _ in flat] == list(range(0, total, chunk))
    assert sum(n for _, n in flat) == total and all(0 < n <= chunk for _, n in flat)
    assert all(sum(n for _, n in b) <= max(chunk, batch) for b in batches)


def test_a_buffer_filled_bucket_by_bucket_pulls_as_the_whole_publish(pair):
    """``publish_stream``: the layout is planned from (name, dtype, shape) alone, the buckets fill it in any
    grouping, and the pulled bytes, manifest and checksums equal a whole ``publish`` of the same arrays."""
    publisher, puller = pair
    w = model(seed=5)
    specs = [(n, a.dtype, a.shape) for n, a in w.items()]
    desc = publisher.publish_stream(specs, iter([{"bias": w["bias"]}, {"embed": w["embed"]}]), version=1)
    got, stats = puller.pull(desc)
    assert stats.checksum_ok and all(np.array_equal(got[n], w[n]) for n in w)
    whole = publisher.publish(w, version=2)
    assert whole.manifest.chunk_checksums == desc.manifest.chunk_checksums
    assert whole.manifest.tensors == desc.manifest.tensors


def test_the_published_tensors_are_views_of_the_last_version_in_the_buffer(pair):
    """``published()``: what the core writes to its weights directory after a streamed publish, without a copy."""
    publisher, _ = pair
    with pytest.raises(TransferError, match="nothing published"):
        publisher.published()
    w = model(seed=7)
    publisher.publish_stream([(n, a.dtype, a.shape) for n, a in w.items()], iter([w]), version=1)
    views = publisher.published()
    assert list(views) == list(w) and all(np.array_equal(views[n], w[n]) and views[n].dtype == w[n].dtype for n in w)
    assert all(not views[n].flags.owndata for n in w)  # into the buffer
    w2 = model(seed=8)
    publisher.publish(w2, version=2)
    assert all(np.array_equal(publisher.published()[n], w2[n]) for n in w2)


def test_a_stream_that_misses_or_repeats_a_tensor_publishes_nothing(pair):
    publisher, puller = pair
    w = model(seed=6)
    specs = [(n, a.dtype, a.shape) for n, a in w.items()]
    good = publisher.publish(w, version=1)
    with pytest.raises(TransferError, match="never came"):
        publisher.publish_stream(specs, iter([{"embed": w["embed"]}]), version=2)
    with pytest.raises(TransferError, match="sent twice"):
        publisher.publish_stream(specs, iter([{"embed": w["embed"]}, {"embed": w["embed"]}]), version=3)
    with pytest.raises(TransferError, match="rewriting|stale"):
        puller.pull(good)  # the buffer was being rewritten: the old descriptor no longer pulls
