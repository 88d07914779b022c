"""The hub stamps each ready group with ``ready_version``, the point that splits its staleness into pre-queue and
in-queue parts: the real ``Hub`` on a real MPI communicator (this process alone, as in test_hub_recovery.py)."""
import numpy as np
import pytest

from gyre_hpc.allocator.types import Role
from gyre_hpc.live import dataplane as dp
from gyre_hpc.live.hub import Hub

pytestmark = [pytest.mark.mpi]


class _Batch:
    def __init__(self, versions):
        self.version = np.array(versions)
        self.loss_mask = np.ones(len(versions), np.float32)


def test_a_group_is_ready_at_the_newest_version_known_and_its_lag_splits_there():
    from mpi4py import MPI

    comm = MPI.COMM_SELF.Dup()
    hub = Hub(comm, 1, True, 1, lambda cell: Role.TRAIN, lambda rec: None)

    def want():
        comm.send({"cell": 0}, dest=0, tag=dp.WANT)
        hub.poll()
        return dp.poll(comm, dp.GROUP)[1]

    try:
        hub.offer(dp.Group(0, _Batch([0, 0]), 2, gen_versions=(0,)))
        hub.offer(dp.Group(1, _Batch([0, 0, 0]), 3, gen_versions=(0,)))
        assert want()["group"].ready_version == 0  # ready and trained at version 0: no lag at all
        comm.send({"version": 1, "gids": [0]}, dest=0, tag=dp.STEPPED)
        hub.poll()
        hub.offer(dp.Group(2, _Batch([0, 2]), 2, gen_versions=(0, 2)))  # version 2's tokens, before STEPPED(2)
        got = want()
        group1 = got["group"]
        assert (got["version"], group1.gid, group1.ready_version) == (1, 1, 0)  # waited one version in the queue
        lag = dp.lag_stats(group1.batch, got["version"], group1.ready_version)
        assert (lag["pre_sum"], lag["in_sum"], lag["sum"]) == (0.0, 3.0, 3.0)
        comm.send({"version": 2, "gids": [1]}, dest=0, tag=dp.STEPPED)
        hub.poll()
        group2 = want()["group"]
        assert (group2.gid, group2.ready_version) == (2, 2)  # its own newest tokens set the floor
        lag = dp.lag_stats(group2.batch, 2, group2.ready_version)
        assert (lag["pre_sum"], lag["in_sum"], lag["sum"]) == (2.0, 0.0, 2.0)
    finally:
        comm.Free()
