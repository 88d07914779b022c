"""A weight publisher hosted in a spawned process, driven over a pipe (integration tests and benchmarks).

The child creates its publisher after the spawn (Mooncake engines must not cross a fork), generates the
weights itself from a seed (so hundreds of MiB never cross the pipe), and answers each ``publish`` with the
descriptor as a plain dict, exactly what the live runtime will send over MPI.

Invariants
- ``synthetic_weights(nbytes, seed)`` is deterministic: the parent regenerates the expected bytes.
- Every call waits at most ``reply_timeout_s``; a dead or silent child is a ``TransferError``, never a hang.
- ``close`` (and leaving the ``with`` block) stops the child: politely, then by its PID.
"""
from __future__ import annotations

import multiprocessing as mp

import numpy as np

from gyre_hpc.config import TransferConfig
from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.base import WeightDescriptor


def synthetic_weights(nbytes: int, seed: int = 0, tensors: int = 8) -> dict[str, np.ndarray]:
    """``tensors`` float32 arrays of about ``nbytes`` in total, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    per = max(1, nbytes // 4 // tensors)
    return {f"layers.{i}.weight": rng.random(per, dtype=np.float32).reshape(-1, 4 if per % 4 == 0 else 1)
            for i in range(tensors)}


def _serve(cfg: TransferConfig, conn) -> None:
    from gyre_hpc.transfer import make_publisher

    try:
        publisher = make_publisher(cfg)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", publisher.location))
    with publisher:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                return
            _, version, nbytes, seed = message
            try:
                desc = publisher.publish(synthetic_weights(nbytes, seed), version)
                conn.send(("ok", desc.to_dict()))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))


class PublisherProcess:
    """``with PublisherProcess(cfg) as pub: desc = pub.publish(version=1, nbytes=4 << 20, seed=0)``."""

    def __init__(self, cfg: TransferConfig, reply_timeout_s: float = 120.0):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.reply_timeout_s = reply_timeout_s
        self.process = ctx.Process(target=_serve, args=(cfg, child), daemon=True, name="gyre-publisher")
        self.process.start()
        child.close()
        try:
            self.location = self._reply("ready")
        except TransferError:
            self.close()
            raise

    def publish(self, version: int, nbytes: int, seed: int = 0) -> WeightDescriptor:
        self._conn.send(("publish", version, nbytes, seed))
        return WeightDescriptor.from_dict(self._reply("ok"))

    def kill(self) -> None:
        """Kill the child at once (SIGKILL), as a crashed core cell would die."""
        self.process.kill()
        self.process.join(timeout=10)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.kill()
        self._conn.close()

    def _reply(self, expected: str):
        if not self._conn.poll(self.reply_timeout_s):
            raise TransferError(f"publisher process {self.process.pid} sent nothing for {self.reply_timeout_s} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            raise TransferError(f"publisher process {self.process.pid} exited "
                                f"(exit code {self.process.exitcode})") from None
        if kind != expected:
            raise TransferError(f"publisher process {self.process.pid}: {payload}")
        return payload

    def __enter__(self) -> "PublisherProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
