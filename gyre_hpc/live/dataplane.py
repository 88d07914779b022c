"""The data plane of a live run (edge: mpi4py): training groups out of rank 0, gradients into the core.

It runs on its own duplicate of the control world (the allocator and the cells' leaders; ``open_data_comm``, a collective call every rank makes
right after building its ``MpiTransport``), so nothing here can match a control message. Four tags::

    cell  ──WANT(cell, have_version)─────────────▶ rank 0 (the hub)
    cell  ◀─GROUP(version, group | None, desc)──── rank 0
    satellite ──GRADS(version, gid, Z, grads=descriptor, lag, group?, extra)▶ core cell's rank
    core  ──STEPPED(version, step record, progress)▶ rank 0   (the one report of an optimizer step)

GRADS carries no gradient array: ``grads`` is the descriptor (names, offsets, checksums) of the satellite's
gradient buffer, which the core pulls over the transfer backend (``transfer.gradients``); ``group`` and the
trainer's logprobs travel only when ``train.epochs > 1`` (the core trains the group again).

The hub (``live.hub``) hands each optimizer step exactly ``batch_groups`` ready groups, in completion order,
only to cells that the allocator's state has in TRAIN; the core steps once it holds the gradients of all of
them (its own and the satellites'). Payloads are plain Python objects (pickled by mpi4py); gradients are not
among them.

A group can reach the core twice: when the allocator marks a satellite LOST (hung: heartbeats stopped) the hub
hands the groups it held to another training cell, and the lost satellite may still deliver them later, or
may have delivered them just before it was found silent. The core's ``GradLedger`` takes each group once per
version and drops the other copy and any gradient of an older version.

Staleness of a trained token generated at version g, whose group became ready at version r and is trained at
version v: ``v - g = (r - g) + (v - r)``, the pre-queue part (the policy moved on while the run still
generated) plus the in-queue part (the group waited in the ready buffer).

Invariants (tests/integration/test_live_training.py, tests/integration/test_hub_recovery.py,
tests/unit/test_lag_split.py)
- A message on the data plane never uses the control communicator, and every payload names the policy
  version it belongs to.
- ``GradLedger``: the core sums the gradients of each group at most once per version, and only of its current
  version (a newer version is a ``ProtocolError``); a dropped copy never stops the step, whose
  ``batch_groups`` groups are distinct.
- A send that the end of a run leaves pending keeps its buffer until the receiver has taken it (``settle``).
- ``lag_stats``: pre-queue sum + in-queue sum = total lag sum, token by token; a ready version below a token's
  generating version, or a trained version below the ready version, is refused (``ProtocolError``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from gyre_hpc.allocator.staleness import token_lags
from gyre_hpc.clock import wait_until
from gyre_hpc.errors import ProtocolError

WANT, GROUP, GRADS, STEPPED = 11, 12, 13, 14
HUB = 0


def open_data_comm(base: Any = None) -> Any:
    """A private duplicate of ``base`` (the control world; default COMM_WORLD) for the data plane (collective:
    every rank of it calls it once, in order)."""
    comm = (MPI.COMM_WORLD if base is None else base).Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


@dataclass
class Group:
    """A ready group as the trainers see it: the packed batch of its trained runs (None: nothing trains)."""

    gid: int
    batch: Any  # PackedBatch | None
    trained_tokens: int
    rewards: list = field(default_factory=list)  # scores of the group's runs that have one
    runs: int = 0
    t_ready: float = 0.0  # rank 0 wall clock when the group became ready
    gen_versions: tuple = ()  # distinct versions that generated its tokens
    ready_version: int = 0  # newest policy version when it became ready (the hub sets it on intake)


class GradLedger:
    """The groups whose gradients the core holds for its current ``version``."""

    def __init__(self, version: int):
        self.version = version
        self.gids: list[int] = []
        self.dropped: list[dict] = []

    def admits(self, version: int, gid: int) -> bool:
        """Would ``take`` accept this copy? (Nothing recorded: the core asks before it pulls the gradients.)"""
        if version > self.version:
            raise ProtocolError(f"gradients of version {version} (group {gid}) reached the core at version "
                                f"{self.version}: no cell can hold weights the core has not made")
        return version == self.version and gid not in self.gids

    def take(self, version: int, gid: int) -> bool:
        """True if group ``gid``'s gradients of ``version`` belong to this step; a late or second copy is
        recorded in ``dropped`` and refused."""
        if self.admits(version, gid):
            self.gids.append(gid)
            return True
        why = "stale" if version < self.version else "duplicate"
        self.dropped.append({"gid": gid, "version": version, "core_version": self.version, "why": why})
        return False

    def stepped(self) -> list[int]:
        """The optimizer step was taken: the next version starts empty; returns the step's groups."""
        gids, self.gids = self.gids, []
        self.version += 1
        return gids


def poll(comm: Any, tag: int, source: int = MPI.ANY_SOURCE) -> tuple[int, Any] | None:
    """One message with ``tag`` if one is waiting: (source rank, payload)."""
    status = MPI.Status()
    msg = comm.improbe(source=source, tag=tag, status=status)
    if msg is None:
        return None
    return status.Get_source(), msg.recv()


#: pending sends whose receiver never came within ``settle``'s time: kept for the rest of the process
_KEPT: list = []


def settle(requests: list, timeout_s: float, clock=None) -> bool:
    """Wait until every pending send in ``requests`` has completed (its receiver took the message), up to
    ``timeout_s``; True when all did. A send's pickled buffer must outlive its receive: Open MPI's shared-memory
    transport copies a large message straight out of the sender's memory when the receiver matches it, so a
    buffer freed first hands the receiver garbage (seen in CI: ``UnpicklingError`` on the core at the end of a
    run, after a satellite's runner, and with it its pending send, was freed). Sends still pending at the
    timeout are kept referenced for the rest of the process."""
    done = bool(wait_until(lambda: MPI.Request.testall(requests)[0], timeout_s, clock, poll_s=1e-3, max_poll_s=0.05))
    if not done:
        _KEPT.extend(requests)
    return done


def discard(comm: Any, tag: int) -> int:
    """Receive and drop every message with ``tag`` waiting now, as raw bytes (never unpickled: a message dropped
    at the end of a run need not decode, and mpi4py sends a large pickled object's out-of-band buffers as messages
    of their own); returns how many."""
    n = 0
    while True:
        status = MPI.Status()
        msg = comm.improbe(source=MPI.ANY_SOURCE, tag=tag, status=status)
        if msg is None:
            return n
        msg.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE])
        n += 1


def wait(comm: Any, tag: int, source: int, timeout_s: float, idle=None) -> Any:
    """The next payload with ``tag`` from ``source``; ``idle()`` runs between polls (heartbeats)."""
    got = wait_until(lambda: poll(comm, tag, source), timeout_s, poll_s=1e-4, max_poll_s=5e-3, idle=idle)
    if got is not None:
        return got[1]
    raise TimeoutError(f"no data-plane message (tag {tag}) from rank {source} within {timeout_s} s")


LAG_KEYS = ("sum", "tokens", "max", "pre_sum", "pre_max", "in_sum", "in_max")


def lag_stats(batch: Any, version: int, ready_version: int | None = None) -> dict:
    """Lag of ``batch``'s trained tokens trained at ``version`` (lag = version - generating version), split at
    ``ready_version`` (None: ``version``, nothing in the queue) into pre-queue and in-queue parts::

        {"sum", "tokens", "max", "pre_sum", "pre_max", "in_sum", "in_max"}   (each part measured on its own)
    """
    ready = version if ready_version is None else ready_version
    gen = np.zeros(0, np.int64) if batch is None else np.asarray(batch.version)[batch.loss_mask > 0]
    if gen.size == 0:
        return dict.fromkeys(LAG_KEYS, 0)
    if ready > version or int(gen.max()) > ready:
        raise ProtocolError(f"versions out of order: generated up to {int(gen.max())}, ready at {ready}, "
                            f"trained at {version}")
    pre = ready - gen
    lag_sum, tokens, lag_max = token_lags(version, gen)  # the simulator's definition (allocator/staleness.py)
    return {"sum": lag_sum, "tokens": int(tokens), "max": lag_max,
            "pre_sum": float(pre.sum()), "pre_max": int(pre.max()),
            "in_sum": float((version - ready) * gen.size), "in_max": version - ready}


def merge_lag(acc: dict | None, lag: dict) -> dict:
    """Two ``lag_stats`` results as one (sums add, maxima take the larger)."""
    if acc is None:
        return dict(lag)
    return {k: max(acc[k], lag[k]) if k.endswith("max") else acc[k] + lag[k] for k in LAG_KEYS}


def lag_record(lag: dict | None) -> dict:
    """The step record's staleness fields: per-trained-token means and maxima, total and split."""
    lag = lag or dict.fromkeys(LAG_KEYS, 0)
    n = max(lag["tokens"], 1)
    return {"staleness_mean": lag["sum"] / n, "staleness_max": lag["max"],
            "staleness_prequeue_mean": lag["pre_sum"] / n, "staleness_prequeue_max": lag["pre_max"],
            "staleness_inqueue_mean": lag["in_sum"] / n, "staleness_inqueue_max": lag["in_max"],
            "lag_tokens": lag["tokens"]}


def to_numpy(grads: dict) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in grads.items()}
