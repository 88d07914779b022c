"""Weight-pull throughput: Mooncake Transfer Engine (TCP) vs a plain loopback socket vs in-process memcpy.

Every backend pulls the same synthetic float32 weights (same seed, same size) through the same
``BufferPuller`` flow (chunked reads, header check, xxh3 chunk checksums). Mooncake and socket publishers
live in a spawned process (as the core cell would); the in-process publisher shares the puller's process.
Repeats are interleaved (run r of every backend before run r+1) so background load hits all backends alike.
One warm-up pull per backend (session handshake) is not counted. Reported: medians of wire GB/s (data +
header reads) and end-to-end GB/s (wire + checksum verification), and ratios against the socket baseline;
then the speed of each manifest checksum over the same number of bytes, against zlib crc32.

    python benchmarks/bench_weight_pull.py --sizes-mib 64 256 --repeats 7
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import sys
import time

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.transfer import make_publisher, make_puller
from gyre_hpc.transfer.manifest import CHECKSUMS, chunk_digests
from gyre_hpc.transfer.process import PublisherProcess, synthetic_weights

BACKENDS = ("mooncake", "socket", "inprocess")


def open_publisher(backend: str, cfg: TransferConfig):
    if backend == "inprocess":
        return make_publisher(cfg)
    return PublisherProcess(cfg)


def publish(publisher, nbytes: int, version: int):
    if isinstance(publisher, PublisherProcess):
        return publisher.publish(version=version, nbytes=nbytes, seed=0)
    return publisher.publish(synthetic_weights(nbytes, seed=0), version)


def measure(size_mib: int, repeats: int, base: TransferConfig) -> dict[str, dict[str, list[float]]]:
    nbytes = size_mib << 20
    expected = synthetic_weights(nbytes, seed=0)
    cfgs = {b: dataclasses.replace(base, backend=b) for b in BACKENDS}
    publishers = {b: open_publisher(b, cfgs[b]) for b in BACKENDS}
    pullers = {b: make_puller(cfgs[b]) for b in BACKENDS}
    try:
        descs = {b: publish(publishers[b], nbytes, version=1) for b in BACKENDS}
        results = {b: {"wire": [], "total": []} for b in BACKENDS}
        for b in BACKENDS:  # warm-up (handshake, page faults); also checks the bytes once per backend
            got, _ = pullers[b].pull(descs[b])
            assert all(got[k].tobytes() == expected[k].tobytes() for k in expected), b
        for _ in range(repeats):
            for b in BACKENDS:
                _, stats = pullers[b].pull(descs[b])
                assert stats.checksum_ok
                results[b]["wire"].append(stats.bytes / stats.seconds / 1e9)
                results[b]["total"].append(stats.bytes / (stats.seconds + stats.verify_seconds) / 1e9)
        return results
    finally:
        for b in BACKENDS:
            pullers[b].close()
            publishers[b].close()


def report(size_mib: int, results: dict, repeats: int) -> list[str]:
    med = {b: {k: statistics.median(v) for k, v in r.items()} for b, r in results.items()}
    rows = []
    for b in BACKENDS:
        spread = f"{min(results[b]['wire']):.2f}–{max(results[b]['wire']):.2f}"
        rows.append(f"| {size_mib} MiB | {b} | {med[b]['wire']:.2f} | {spread} | {med[b]['total']:.2f} | "
                    f"{med[b]['wire'] / med['socket']['wire']:.2f} | {med[b]['total'] / med['socket']['total']:.2f} |")
    return rows


def checksum_rows(size_mib: int, repeats: int, chunk_bytes: int) -> list[str]:
    """GB/s of each checksum over the same bytes (one core), ratio against zlib crc32."""
    data = np.random.default_rng(0).integers(0, 256, size_mib << 20, dtype=np.uint8)
    speed = {}
    for algorithm in CHECKSUMS:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            chunk_digests(data, algorithm, chunk_bytes)
            times.append(time.perf_counter() - start)
        speed[algorithm] = len(data) / statistics.median(times) / 1e9
    return [f"| {size_mib} MiB | {a} | {speed[a]:.2f} | {speed[a] / speed['crc32']:.2f} |" for a in CHECKSUMS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=7, help="timed pulls per backend and size (>= 5)")
    parser.add_argument("--chunk-mib", type=int, default=TransferConfig().chunk_bytes >> 20)
    args = parser.parse_args(argv)
    base = TransferConfig(chunk_bytes=args.chunk_mib << 20)
    print(f"# bench_weight_pull  {datetime.date.today()}  {platform.machine()} python {sys.version.split()[0]}  "
          f"repeats={args.repeats} chunk={args.chunk_mib} MiB batch={base.batch_bytes >> 20} MiB "
          f"checksum={base.checksum}")
    print("| size | backend | wire GB/s (median) | wire min–max | end-to-end GB/s (with verify) | "
          "wire ratio vs socket | end-to-end ratio vs socket |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes_mib:
        for row in report(size, measure(size, args.repeats, base), args.repeats):
            print(row, flush=True)
    print(f"\n| size | checksum ({base.checksum_chunk_bytes >> 20} MiB chunks) | GB/s (median) | ratio vs crc32 |")
    print("|---|---|---|---|")
    for row in checksum_rows(max(args.sizes_mib), args.repeats, base.checksum_chunk_bytes):
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
