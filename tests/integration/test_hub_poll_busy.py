"""What the hub's ``poll`` reports to rank 0's loop: busy (poll again at once) only when something happened -- a
group went out or a step record came -- not for a WANT answered with no group (an idle training cell asks every
20 ms). The real ``Hub`` on a real MPI communicator (this process alone, as in test_hub_recovery.py)."""
import numpy as np
import pytest

from gyre_hpc.allocator.types import Role
from gyre_hpc.live import dataplane as dp
from gyre_hpc.live.hub import Hub

pytestmark = [pytest.mark.mpi]


class _Batch:
    def __init__(self, n):
        self.version = np.zeros(n, np.int64)
        self.loss_mask = np.ones(n, np.float32)


def test_a_want_answered_with_no_group_is_not_busy_but_a_handed_group_and_a_step_record_are():
    from mpi4py import MPI

    comm = MPI.COMM_SELF.Dup()
    hub = Hub(comm, 1, True, 1, lambda cell: Role.TRAIN, lambda rec: None)

    def want():
        comm.send({"cell": 0}, dest=0, tag=dp.WANT)
        busy = hub.poll()
        return busy, dp.poll(comm, dp.GROUP)[1]["group"]

    try:
        assert hub.poll() is False  # nothing came
        busy, group = want()
        assert (busy, group) == (False, None)  # answered, nothing to hand out
        hub.offer(dp.Group(0, _Batch(2), 2, gen_versions=(0,)))
        busy, group = want()
        assert busy is True and group.gid == 0
        busy, group = want()
        assert (busy, group) == (False, None)  # the version's batch (B = 1) is out
        comm.send({"version": 1, "gids": [0]}, dest=0, tag=dp.STEPPED)
        assert hub.poll() is True
    finally:
        comm.Free()
