"""Two ranks: rank 1 sends a large pickled message without blocking and ends soon after (a satellite whose run
ended while its gradient message was still unread: ``dataplane.settle`` after Bye); rank 0 takes the message only
a second later (the core still busy) and prints whether it arrived whole (tests/integration/test_dataplane_settle.py).
Without the settle (the request dropped, its memory used again) rank 0 read garbage or the sender crashed in
MPI_Finalize ("Read -1, expected 262297, errno = 14"), measured on this machine with Open MPI 4.1.4."""
import json
import time

import numpy as np
from mpi4py import MPI

from gyre_hpc.live import dataplane as dp

comm = MPI.COMM_WORLD
payload = {"gid": 7, "group": np.arange(1 << 15)}  # 256 KiB: read from the sender's memory at the receive
if comm.rank == 1:
    reqs = [comm.isend(payload, dest=0, tag=dp.GRADS)]
    print(json.dumps({"rank": 1, "settled": dp.settle(reqs, 30.0)}), flush=True)
else:
    time.sleep(1.0)
    got = dp.wait(comm, dp.GRADS, 1, 30.0)
    whole = got["gid"] == 7 and bool(np.array_equal(got["group"], payload["group"]))
    print(json.dumps({"rank": 0, "whole": whole}), flush=True)
