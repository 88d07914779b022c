"""The plain-socket baseline transport over 127.0.0.1: exact bytes, range checks, dead publishers."""
import dataclasses
import time

import numpy as np
import pytest

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer import make_publisher, make_puller
from gyre_hpc.transfer.process import PublisherProcess, synthetic_weights

CFG = TransferConfig(backend="socket", timeout_s=2, chunk_bytes=1 << 20, batch_bytes=2 << 20)


@pytest.fixture
def pair():
    with make_publisher(CFG) as publisher, make_puller(CFG) as puller:
        yield publisher, puller


def test_pull_over_a_socket_returns_exact_bytes(pair):
    publisher, puller = pair
    for version, seed in ((1, 1), (2, 2)):
        weights = synthetic_weights(3 << 20, seed)
        got, stats = puller.pull(publisher.publish(weights, version))
        assert all(got[k].tobytes() == weights[k].tobytes() for k in weights)
        assert stats.checksum_ok and stats.backend == "socket"


def test_address_outside_the_buffer_fails_and_the_connection_survives(pair):
    publisher, puller = pair
    desc = publisher.publish(synthetic_weights(1 << 20, 3), version=1)
    with pytest.raises(TransferError, match="address outside the published buffer"):
        puller.pull(dataclasses.replace(desc, address=desc.address + (1 << 30)))
    got, stats = puller.pull(desc)
    assert stats.checksum_ok and got["layers.0.weight"].size > 0


def test_closed_publisher_fails_fast(pair):
    publisher, puller = pair
    desc = publisher.publish({"w": np.arange(1000.0)}, version=1)
    puller.pull(desc)  # the puller now holds an open connection to the publisher
    publisher.close()
    start = time.perf_counter()
    with pytest.raises(TransferError, match=rf"the publisher is closed: .* from {desc.location}"):
        puller.pull(desc)
    with make_puller(CFG) as fresh, pytest.raises(TransferError, match=rf"socket read failed .* {desc.location}"):
        fresh.pull(desc)  # and nobody can connect any more
    assert time.perf_counter() - start < CFG.timeout_s


def test_killed_publisher_process_fails_fast():
    with PublisherProcess(CFG) as proc, make_puller(CFG) as puller:
        desc = proc.publish(version=1, nbytes=2 << 20, seed=4)
        puller.pull(desc)
        proc.kill()
        with pytest.raises(TransferError, match="socket read failed"):
            puller.pull(desc)
