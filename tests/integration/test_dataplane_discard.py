"""Dropping a data-plane tag at the end of a run (``dataplane.discard``): every waiting message with the tag is
received as raw bytes and none is unpickled, so bytes that are no pickle (a large object's out-of-band buffer, sent
by mpi4py as a message of its own) cannot fail the drain; other tags stay queued. A real MPI communicator (this
process alone, as in test_hub_recovery.py)."""
import numpy as np
import pytest

from gyre_hpc.live import dataplane as dp

pytestmark = [pytest.mark.mpi]


def test_discard_drops_every_message_of_the_tag_undecoded_and_leaves_other_tags():
    from mpi4py import MPI

    comm = MPI.COMM_SELF.Dup()
    reqs = [comm.isend({"gid": 1, "grads": np.ones(1 << 17)}, dest=0, tag=dp.GRADS),  # 1 MiB: out-of-band
            comm.Isend([bytearray(b"\x1a not a pickle"), MPI.BYTE], dest=0, tag=dp.GRADS),
            comm.isend({"cell": 0}, dest=0, tag=dp.WANT)]
    assert dp.discard(comm, dp.GRADS) >= 2
    MPI.Request.Waitall(reqs)
    assert dp.poll(comm, dp.GRADS) is None
    assert dp.poll(comm, dp.WANT) == (0, {"cell": 0})
    assert dp.discard(comm, dp.GRADS) == 0
    comm.Free()
