"""The end of a run on the data plane. Dropping a tag (``dataplane.discard``): every waiting message with the tag is
received as raw bytes and none is unpickled, so bytes that are no pickle (a large object's out-of-band buffer, sent
by mpi4py as a message of its own) cannot fail the drain; other tags stay queued. A send the end left pending
(``dataplane.settle``) is done only once its receiver took it. A real MPI communicator (this process alone, as in
test_hub_recovery.py)."""
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


def test_a_pending_send_settles_only_once_its_receiver_took_it_and_the_message_arrives_whole():
    from mpi4py import MPI

    comm = MPI.COMM_SELF.Dup()
    payload = {"gid": 7, "group": np.arange(1 << 16)}  # 512 KiB: read from the sender's memory at the receive
    reqs = [comm.isend(payload, dest=0, tag=dp.GRADS)]
    assert dp.settle(reqs, 0.2) is False  # nobody received yet: the send is still pending
    assert dp._KEPT[-1] is reqs[0]  # and its buffer stays referenced
    source, got = dp.poll(comm, dp.GRADS)
    assert source == 0 and got["gid"] == 7 and np.array_equal(got["group"], payload["group"])
    assert dp.settle(reqs, 5.0) is True
    dp._KEPT.clear()
    comm.Free()
