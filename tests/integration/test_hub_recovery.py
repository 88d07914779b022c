"""Lost-satellite recovery on the data plane: the real ``Hub`` on a real MPI communicator (this process alone).

Every cell is this one rank here: a cell's WANT carries its cell index, the hub answers to the sending rank,
and the test reads the GROUP answers back, so the hub's own MPI code runs unchanged. The allocator's roles
are a dict the test sets, as the allocator marks a silent satellite LOST.
"""
from collections import defaultdict

import pytest

from gyre_hpc.allocator.types import Role
from gyre_hpc.live import dataplane as dp
from gyre_hpc.errors import ProtocolError
from gyre_hpc.live.hub import Hub

pytestmark = [pytest.mark.mpi]

CORE, SAT1, SAT2 = 0, 1, 2


class Plane:
    """The hub with three training cells (core 0, satellites 1 and 2) and the records it emits."""

    def __init__(self, batch_groups=3, streaming=True):
        from mpi4py import MPI

        self.comm = MPI.COMM_SELF.Dup()
        self.roles = defaultdict(lambda: Role.TRAIN)
        self.steps, self.events = [], []
        self.hub = Hub(self.comm, batch_groups, streaming, 3, lambda c: self.roles[c], self.steps.append,
                       on_event=self.events.append)

    def offer(self, *gids):
        for gid in gids:
            self.hub.offer(dp.Group(gid, None, 0, rewards=[gid / 10], runs=1))

    def want(self, cell):
        """(version, gid or None) the hub answers cell ``cell``'s WANT with."""
        self.comm.send({"cell": cell}, dest=0, tag=dp.WANT)
        self.hub.poll()
        _, got = dp.poll(self.comm, dp.GROUP)
        return got["version"], None if got["group"] is None else got["group"].gid

    def stepped(self, version, gids):
        self.comm.send({"version": version, "gids": list(gids)}, dest=0, tag=dp.STEPPED)
        self.hub.poll()

    def close(self):
        self.comm.Free()


@pytest.fixture
def plane():
    p = Plane()
    yield p
    p.close()


def test_the_groups_of_a_lost_satellite_go_out_again_first_for_the_same_version(plane):
    plane.offer(10, 11, 12, 13)
    assert [plane.want(c) for c in (CORE, SAT1, SAT2)] == [(0, 10), (0, 11), (0, 12)]
    assert plane.want(CORE) == (0, None)  # the batch of version 0 is out
    plane.roles[SAT1] = Role.LOST  # heartbeat timeout: the allocator marked it LOST
    assert plane.want(SAT2) == (0, 11)  # the lost satellite's group, before group 13
    assert plane.events == [{"event": "groups_reissued", "cell": SAT1, "version": 0, "gids": [11]}]
    assert plane.want(CORE) == (0, None)  # still exactly batch_groups groups for version 0
    plane.stepped(1, [10, 12, 11])
    step = plane.steps[-1]
    assert sorted(step["gids"]) == [10, 11, 12] and step["cells"] == [CORE, SAT2]
    assert step["reward"] == pytest.approx(1.1)
    assert plane.want(CORE) == (1, 13)  # version 1 starts with the next group; 11 is not trained twice


def test_a_lost_cell_never_gets_a_group_and_a_reissued_group_can_go_to_the_core(plane):
    plane.offer(20, 21, 22)
    assert [plane.want(c) for c in (SAT1, SAT2)] == [(0, 20), (0, 21)]
    plane.roles[SAT1] = plane.roles[SAT2] = Role.LOST
    assert plane.want(SAT1) == (0, None)
    assert [plane.want(CORE) for _ in range(4)] == [(0, 20), (0, 21), (0, 22), (0, None)]
    assert [e["cell"] for e in plane.events] == [SAT1, SAT2]


def test_a_reissued_group_the_core_already_had_is_not_trained_again(plane):
    plane.offer(30, 31, 32, 33, 34)
    assert [plane.want(c) for c in (CORE, SAT1, SAT2)] == [(0, 30), (0, 31), (0, 32)]
    plane.roles[SAT1] = Role.LOST  # found silent after its gradients of group 31 had reached the core
    plane.hub.poll()
    plane.stepped(1, [30, 31, 32])  # ... so the core stepped without waiting for the re-issued copy
    assert plane.steps[-1]["gids"] == [30, 31, 32] and plane.steps[-1]["cells"] == [CORE, SAT1, SAT2]
    assert [plane.want(CORE) for _ in range(3)] == [(1, 33), (1, 34), (1, None)]


def test_a_non_streaming_batch_waits_whole_and_a_reissue_keeps_it_whole():
    plane = Plane(batch_groups=2, streaming=False)
    try:
        plane.offer(40)
        assert plane.want(SAT1) == (0, None)  # colocate/async: a whole batch first
        plane.offer(41, 42)
        assert [plane.want(SAT1), plane.want(SAT2)] == [(0, 40), (0, 41)]
        plane.roles[SAT2] = Role.LOST
        assert plane.want(CORE) == (0, 41)
        plane.stepped(1, [40, 41])
        assert plane.want(CORE) == (1, None)  # group 42 alone is not a batch
    finally:
        plane.close()


def test_the_core_takes_each_group_once_per_version_and_drops_late_copies():
    ledger = dp.GradLedger(version=3)
    assert ledger.take(3, 7) and ledger.take(3, 8)
    assert not ledger.take(3, 7)  # the re-issued copy of group 7, after the lost satellite's own
    assert not ledger.take(2, 9)  # a satellite that was lost during version 2 delivers late
    assert ledger.stepped() == [7, 8] and ledger.version == 4 and ledger.gids == []
    assert not ledger.take(3, 8)
    assert [(d["gid"], d["why"]) for d in ledger.dropped] == [(7, "duplicate"), (9, "stale"), (8, "stale")]
    with pytest.raises(ProtocolError, match="version 5 .group 1. reached the core at version 4"):
        ledger.take(5, 1)


def test_a_fixed_batch_is_shared_with_the_cells_still_switching_to_training():
    plane = Plane(batch_groups=2, streaming=False)
    try:
        plane.roles[SAT1] = plane.roles[SAT2] = Role.DRAINING  # colocate: the core finished its switch first
        plane.offer(50, 51)
        assert [plane.want(CORE), plane.want(CORE)] == [(0, 50), (0, None)]  # its share: ceil(2 / 3) = 1
        plane.roles[SAT1] = Role.TRAIN  # the first satellite pulled the weights and asks
        assert plane.want(SAT1) == (0, 51)
        plane.stepped(1, [50, 51])
        assert plane.steps[-1]["cells"] == [CORE, SAT1]
    finally:
        plane.close()


def test_a_fixed_batch_goes_to_the_core_alone_when_no_other_cell_trains():
    plane = Plane(batch_groups=2, streaming=False)
    try:
        plane.roles[SAT1] = plane.roles[SAT2] = Role.ROLLOUT
        plane.offer(60, 61)
        assert [plane.want(CORE) for _ in range(3)] == [(0, 60), (0, 61), (0, None)]
    finally:
        plane.close()
