"""The job secret across the ranks of a live run (edge: MPI).

The launcher (``gyre train`` on one machine) generates the secret and hands it to mpirun's ranks through the
environment. Ranks started otherwise (srun from an sbatch script, submitit) may have none: then rank 0
generates it. Either way every rank ends with rank 0's secret in ``os.environ`` (so the engines and the proxy it
starts inherit it), and rank 0 keeps it in ``RUN_DIR/job.secret`` (0600).

Invariant: the secret travels only through environments and the job's MPI communicator, never a command line.
"""
from __future__ import annotations

import os
from pathlib import Path

from gyre_hpc.net import auth


def share_job_secret(comm, run_dir: str | Path) -> str:
    """Collective over ``comm``: every rank gets rank 0's job secret (module docstring); returns it."""
    root = comm.Get_rank() == 0
    secret = comm.bcast(auth.ensure_secret() if root else None, root=0)
    os.environ[auth.ENV] = secret
    if root:
        auth.write_secret(run_dir, secret)
    return secret
