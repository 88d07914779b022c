"""Rank 0's side of the data plane: ready groups out to training cells, step records in (edge: mpi4py).

The harness thread ``offer``s each group once all its runs ended and its batch is built; the allocator loop
calls ``poll()`` in every pass (one thread touches MPI). A cell's WANT is answered with the next ready group
when

- the allocator's state has that cell in TRAIN (not in a transition, not LOST),
- fewer than ``batch_groups`` groups went out for the current policy version (the core steps on exactly
  that many), and
- the policy streams, or a whole batch is ready (non-streaming policies train fixed batches of B groups);
- for a fixed batch, the cell holds fewer than its fair share of it: ceil(B / n) groups, n = the cells in
  TRAIN or DRAINING (on their way to training). Data parallelism, not a race: a core that finished its
  switch first must not train the whole batch while the satellites are still pulling its weights;
- a new version's batch starts only while the burst has fewer than the policy's ``mu`` steps;

otherwise with ``None``. The core's STEPPED (after its optimizer step) opens the next version's batch; it is the
step's one report: ``on_step`` (rank 0's root) applies it to the allocator's state before any other WANT is
answered.

Preemption: ``freeze()`` answers every WANT with ``None`` from then on; once no step is pending (fewer than
``batch_groups`` groups out, so the core cannot step again), ``buffer()`` is the trajectory buffer to save: the
groups out for the unfinished step first (their gradients are dropped with the core's partial sums), then
the ready ones, in completion order. ``restore`` puts a saved buffer back before the first WANT.

A lost training cell (the allocator marked it LOST: hung, heartbeats stopped) never sends the gradients of the
groups it holds, and the core would wait for them forever. In every ``poll`` the hub puts the groups handed to
a LOST cell for the current version back at the front of the ready queue (``groups_reissued`` in the event
log), so the next WANT of a training cell — the core's own included — takes them for the same version. The
core takes each group once (``dp.GradLedger``) and names the groups it stepped on in STEPPED; a re-issued group
whose gradients had reached the core before the loss was noticed is then dropped from the queue, not trained
again.

Invariants (tests/integration/test_live_training.py, tests/integration/test_hub_recovery.py)
- Each ready group goes out exactly once, in completion order, and each version gets exactly
  ``batch_groups`` groups; the one exception is a group a LOST cell held, which goes out again, first, for the
  same version, and is trained in exactly one step.
- Per-token staleness = the version a group is trained at − the version that generated the token; a group's
  ``ready_version`` (set on intake: the newest version known then) splits it into pre-queue and in-queue parts,
  and lies between its tokens' generating versions and the version it is trained at.
"""
from __future__ import annotations

import queue
from collections import deque
from typing import Any, Callable

from gyre_hpc.allocator.batches import batch_may_start
from gyre_hpc.allocator.types import Role
from gyre_hpc.live import dataplane as dp


class Hub:
    def __init__(self, comm: Any, batch_groups: int, streaming: bool, cells: int, role_of: Callable[[int], Role],
                 on_step: Callable[[dict], None], burst_open: Callable[[], bool] = lambda: True,
                 on_event: Callable[[dict], None] = lambda rec: None):
        self.comm, self.B, self.streaming = comm, batch_groups, streaming
        self.burst_open, self.on_event = burst_open, on_event
        self.cells, self.role_of, self.on_step = cells, role_of, on_step
        self.incoming: queue.SimpleQueue[dp.Group] = queue.SimpleQueue()
        self.ready: deque[dp.Group] = deque()
        self.version = 0
        self.handed: list[dp.Group] = []  # groups out for the current version
        self.handed_to: dict[int, int] = {}
        self.issued: dict[int, dp.Group] = {}  # every group handed for the current version, re-issued ones too
        self.frozen = False

    @property
    def step_pending(self) -> bool:
        """A whole batch is out: the core steps once it has their gradients."""
        return len(self.handed) >= self.B

    def freeze(self) -> None:
        """Hand out no more groups (preemption): the core finishes at most the step already fully out."""
        self.frozen = True

    def buffer(self) -> list[dp.Group]:
        """The untrained groups, in the order they would be handed out (see the module docstring)."""
        self._take_incoming()
        return list(self.handed) + list(self.ready)

    def restore(self, groups: list[dp.Group], version: int) -> None:
        self.version = version
        self.ready.extend(groups)

    def offer(self, group: dp.Group) -> None:
        """A group became ready (thread-safe; called from the harness thread)."""
        self.incoming.put(group)

    def poll(self) -> bool:
        """Answer waiting requests and take step records; True if anything happened: a step record came, a group
        went out or was re-issued. A WANT answered with ``None`` changed nothing: it is no reason for rank 0's loop
        to poll again at once (a training cell with nothing to train asks every 20 ms; resetting the loop's
        back-off for each kept rank 0 polling at its shortest sleep: benchmarks/results/test_cpu.md)."""
        self._take_incoming()
        busy = self._reissue_lost()
        while (got := dp.poll(self.comm, dp.STEPPED)) is not None:
            busy = True
            self._stepped(got[1])
        while (got := dp.poll(self.comm, dp.WANT)) is not None:
            rank, want = got
            group = self._next(want["cell"])
            busy |= group is not None
            self.comm.send({"version": self.version, "group": group}, dest=rank, tag=dp.GROUP)
        return busy

    def _take_incoming(self) -> None:
        while True:
            try:
                group = self.incoming.get_nowait()
            except queue.Empty:
                break
            # the newest version known now (its own tokens prove theirs exists, even before STEPPED arrives)
            group.ready_version = max(self.version, *group.gen_versions, 0)
            self.ready.append(group)

    def _next(self, cell: int) -> dp.Group | None:
        if self.frozen:
            return None
        if self.role_of(cell) is not Role.TRAIN or len(self.handed) >= self.B or not self.ready:
            return None
        if not self.handed and not self.burst_open():
            return None  # the burst has its mu steps: the next batch waits for the next burst
        if not batch_may_start(self.streaming, bool(self.handed), len(self.ready), self.B):
            return None  # a fixed batch starts only once it is whole (allocator.batches)
        if not self.streaming and self._had_share(cell):
            return None
        group = self.ready.popleft()
        self.handed.append(group)
        self.handed_to[group.gid] = cell
        self.issued[group.gid] = group
        return group

    def _had_share(self, cell: int) -> bool:
        joining = sum(self.role_of(c) in (Role.TRAIN, Role.DRAINING) for c in range(self.cells))
        held = sum(self.handed_to[g.gid] == cell for g in self.handed)
        return held >= -(-self.B // max(1, joining))

    def _reissue_lost(self) -> bool:
        """Put the groups LOST cells hold back at the front of the ready queue, in their order; True if any."""
        lost = [g for g in self.handed if self.role_of(self.handed_to[g.gid]) is Role.LOST]
        if not lost:
            return False
        gone = {g.gid for g in lost}
        self.handed = [g for g in self.handed if g.gid not in gone]
        self.ready.extendleft(reversed(lost))
        for cell in sorted({self.handed_to[g.gid] for g in lost}):
            self.on_event({"event": "groups_reissued", "cell": cell, "version": self.version,
                           "gids": [g.gid for g in lost if self.handed_to[g.gid] == cell]})
        return True

    def _stepped(self, rec: dict) -> None:
        trained = set(rec.get("gids", [g.gid for g in self.handed]))
        groups = [self.issued[gid] for gid in self.issued if gid in trained]
        self.ready = deque(g for g in self.ready if g.gid not in trained)  # re-issued, but the core had it
        rewards = [r for g in groups for r in g.rewards]
        rec = {**rec, "step": rec["version"], "trained_version": self.version,
               "reward": sum(rewards) / len(rewards) if rewards else None, "reward_std": _std(rewards),
               "scored_runs": len(rewards),
               "runs": sum(g.runs for g in groups), "gids": [g.gid for g in groups],
               "cells": sorted({self.handed_to.pop(g.gid) for g in groups})}
        self.version = rec["version"]
        self.handed = []
        self.issued = {}
        self.on_step(rec)


def _std(xs: list[float]) -> float | None:
    """Population standard deviation of a step's rewards (None without any)."""
    if not xs:
        return None
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
