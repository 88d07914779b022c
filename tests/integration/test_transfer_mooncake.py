"""Weight pulls over the real Mooncake Transfer Engine (TCP on 127.0.0.1), publisher in a spawned process."""
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer import make_publisher, make_puller
from gyre_hpc.transfer.base import HEADER_BYTES
from gyre_hpc.transfer.process import PublisherProcess, synthetic_weights

pytestmark = pytest.mark.mooncake

TIMEOUT_S = 2
CFG = TransferConfig(backend="mooncake", timeout_s=TIMEOUT_S, chunk_bytes=1 << 20, batch_bytes=2 << 20,
                     checksum_chunk_bytes=256 << 10)
NBYTES = 6 << 20


def pull_through_stalls(puller, desc, attempts: int = 3):
    """A pull that is not the test's subject (before a kill or a freeze, and after it). The stall timeout here is 2 s, and
    on a loaded 2-core CI machine a freshly spawned publisher's first serve has stalled that long (CI of stop 20:
    "no transfer progress within 2s"): a timed-out attempt quarantines its buffer and is tried again."""
    for attempt in range(attempts):
        try:
            return puller.pull(desc)
        except TransferError:
            if attempt == attempts - 1:
                raise


def assert_same(got, expected):
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert got[name].tobytes() == array.tobytes(), name


@pytest.fixture(scope="module")
def publisher():
    with PublisherProcess(CFG) as proc:
        yield proc


@pytest.fixture(scope="module")
def puller():
    with make_puller(CFG) as pull:
        yield pull


def test_spawned_publisher_serves_exact_bytes_then_a_second_version(publisher, puller):
    for version, seed in ((1, 11), (2, 22)):
        desc = publisher.publish(version=version, nbytes=NBYTES, seed=seed)
        got, stats = puller.pull(desc)
        assert_same(got, synthetic_weights(NBYTES, seed))
        assert stats.version == version and stats.checksum_ok is True
        assert stats.bytes == HEADER_BYTES + desc.manifest.total_bytes and stats.gb_per_s > 0


def test_descriptor_of_a_replaced_version_is_refused_as_stale(publisher, puller):
    old = publisher.publish(version=10, nbytes=NBYTES, seed=1)
    publisher.publish(version=11, nbytes=NBYTES, seed=2)
    with pytest.raises(TransferError, match="stale descriptor: .* now serves version 11"):
        puller.pull(old)


def test_descriptor_outside_the_registered_buffer_fails(publisher, puller):
    desc = publisher.publish(version=20, nbytes=NBYTES, seed=3)
    forged = dataclasses.replace(desc, address=desc.address + (1 << 30))
    with pytest.raises(TransferError, match=rf"Mooncake read failed .* from {desc.location}"):
        puller.pull(forged)
    got, _ = puller.pull(desc)  # the publisher survives the bad request
    assert_same(got, synthetic_weights(NBYTES, 3))


def test_grown_weights_are_re_registered_and_old_addresses_fail(publisher, puller):
    small = publisher.publish(version=30, nbytes=1 << 20, seed=4)
    big = publisher.publish(version=31, nbytes=3 * NBYTES, seed=5)
    got, _ = puller.pull(big)
    assert_same(got, synthetic_weights(3 * NBYTES, 5))
    with pytest.raises(TransferError):
        puller.pull(small)


def test_unreachable_publisher_fails_fast(publisher, puller):
    desc = dataclasses.replace(publisher.publish(version=40, nbytes=1 << 20, seed=0), location="127.0.0.1:1")
    start = time.perf_counter()
    with pytest.raises(TransferError, match="from 127.0.0.1:1"):
        puller.pull(desc)
    assert time.perf_counter() - start < TIMEOUT_S


def test_corrupted_publisher_bytes_fail_the_checksum(puller):
    with make_publisher(CFG) as local:  # in this process, so the test can flip a byte of its buffer
        weights = synthetic_weights(1 << 20, seed=6)
        desc = local.publish(weights, version=1)
        entry = desc.manifest.tensors[3]
        local._memory.buffer[HEADER_BYTES + entry.offset + 100] ^= 0x40  # a flipped bit on the publisher side
        with pytest.raises(TransferError, match=rf"checksum mismatch in 1 of .* damaged tensors: .*{entry.name}"):
            puller.pull(desc)


def test_killed_publisher_fails_fast_and_quarantines_the_destination():
    with PublisherProcess(CFG) as proc, make_puller(CFG) as puller:
        desc = proc.publish(version=1, nbytes=NBYTES, seed=7)
        pull_through_stalls(puller, desc)
        quarantined = puller.quarantined
        proc.kill()
        start = time.perf_counter()
        with pytest.raises(TransferError, match=rf"Mooncake read failed .* version 1 from {desc.location}"):
            puller.pull(desc)
        assert time.perf_counter() - start < TIMEOUT_S
        assert puller.quarantined == quarantined + 1


def test_frozen_publisher_times_out_and_the_next_pull_uses_a_fresh_buffer():
    with PublisherProcess(CFG) as proc, make_puller(CFG) as puller:
        desc = proc.publish(version=1, nbytes=NBYTES, seed=8)
        first, _ = pull_through_stalls(puller, desc)
        os.kill(proc.process.pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            with pytest.raises(TransferError, match="Mooncake read failed"):
                puller.pull(desc)
            waited = time.perf_counter() - start
        finally:
            os.kill(proc.process.pid, signal.SIGCONT)
        assert TIMEOUT_S * 0.5 <= waited < TIMEOUT_S + 2  # Mooncake's own TCP default would wait 5 s
        again, stats = pull_through_stalls(puller, desc)  # the publisher runs on; under load it may stall once more
        assert stats.checksum_ok and not np.shares_memory(again["layers.0.weight"], first["layers.0.weight"])
        assert_same(again, synthetic_weights(NBYTES, 8))


def has_rdma_device() -> bool:
    return Path("/sys/class/infiniband").exists() and any(Path("/sys/class/infiniband").iterdir())


def test_rdma_without_a_device_fails_fast_instead_of_falling_back_to_tcp():
    if has_rdma_device():
        pytest.skip("this host has RDMA devices; the no-device path cannot occur here")
    with pytest.raises(TransferError, match="protocol=rdma but Mooncake finds no RDMA device"):
        make_puller(dataclasses.replace(CFG, protocol="rdma"))


def test_publisher_process_reports_a_failed_start_and_exits():
    if has_rdma_device():
        pytest.skip("this host has RDMA devices; an rdma publisher would start")
    with pytest.raises(TransferError, match=r"publisher process \d+: TransferError: transfer.protocol=rdma"):
        PublisherProcess(dataclasses.replace(CFG, protocol="rdma"))


def test_publisher_process_stops_when_the_block_ends():
    with PublisherProcess(CFG) as proc:
        assert proc.publish(version=1, nbytes=1 << 10, seed=0).location == proc.location
    assert not proc.process.is_alive() and proc.process.exitcode == 0


@pytest.mark.slow
def test_weight_pull_benchmark_runs_and_checks_its_bytes():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_weight_pull.py"
    out = subprocess.run([sys.executable, str(script), "--sizes-mib", "1", "--repeats", "1", "--chunk-mib", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 1 MiB |")]
    assert [row.split("|")[2].strip() for row in rows] == ["mooncake", "socket", "inprocess", "xxh3_64", "crc32"]
