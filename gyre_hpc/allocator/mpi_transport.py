"""The MPI transport: the allocator protocol on its own duplicated communicator (edge module: imports mpi4py).

Model: mpi4py's ``demo/nxtval`` and ``futures/_core.py`` — a server loop on a private ``comm.Dup()`` so no
other MPI traffic of the process (torch.distributed, a library) can match its messages; non-blocking
matched probes (``improbe``) polled with exponential back-off (``Transport.recv``, the server's idle loop);
one tag, typed payloads (``to_dict()``, pickled by mpi4py).

Launch: ``mpirun -n 1+K`` (add ``--enable-recovery`` so that a dying cell rank does not abort the others,
``--oversubscribe`` on one machine, ``OMPI_MCA_btl=self,tcp`` across emulated nodes) or
``srun --mpi=pmix --ntasks=1+K`` (``Layout.control_srun_args()``).

Invariants (tests/integration/test_mpi_transport.py)
- The world has exactly the expected size, or construction raises ``LayoutError`` (a mismatched launcher
  silently starts N single-rank worlds).
- Messages use only the duplicated communicator; ``close()`` frees it exactly once.
- An MPI error while sending (the peer is gone) becomes ``CellLostError``; errors are never fatal to the job
  (the communicator's error handler returns errors as exceptions).
- After a peer rank died, no rank calls ``MPI_Finalize`` (``exit_process``): with Open MPI 4.1.4 and
  ``--enable-recovery`` it hung in about 1 of 6 runs with a dead rank; exiting without it ended 8 of 8 cleanly.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from mpi4py import MPI

from gyre_hpc.allocator.transport import Transport
from gyre_hpc.clock import Clock
from gyre_hpc.errors import CellLostError, LayoutError

TAG = 0x6779  # "gy"


class MpiTransport(Transport):
    """This rank's endpoint on a duplicate of ``comm`` (default ``MPI.COMM_WORLD``) of ``expected_size`` ranks."""

    def __init__(self, expected_size: int, comm: Any = None, clock: Clock | None = None,
                 backoff_max_s: float = 5e-3):
        base = MPI.COMM_WORLD if comm is None else comm
        size = base.Get_size()
        if size != expected_size:
            raise LayoutError(f"the MPI world has {size} ranks, the layout needs {expected_size} (1 allocator + "
                              f"{expected_size - 1} cells): launch with mpirun -n {expected_size} or "
                              f"srun --ntasks={expected_size} --mpi=pmix")
        super().__init__(base.Get_rank(), size, clock, backoff_max_s)
        self.comm = base.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._status = MPI.Status()

    def _put(self, dest: int, data: dict[str, Any]) -> None:
        try:
            self.comm.send(data, dest=dest, tag=TAG)
        except MPI.Exception as exc:
            raise CellLostError(f"rank {dest} unreachable: {exc.Get_error_string()}") from None

    def _get(self) -> tuple[int, Any] | None:
        msg = self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG, status=self._status)
        if msg is None:
            return None
        return self._status.Get_source(), msg.recv()

    def close(self) -> None:
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def exit_process(code: int = 0, peers_lost: bool = False) -> None:
    """End this rank after the orderly shutdown. With every peer alive, return (the interpreter finalizes MPI
    at exit). After a peer died, flush stdio and ``os._exit(code)`` without ``MPI_Finalize``, which can hang
    waiting for the dead rank; nothing registered with ``atexit`` runs then."""
    if not peers_lost:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
