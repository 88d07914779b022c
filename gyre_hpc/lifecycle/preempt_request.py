"""How a launcher tells the ranks of a run that it is preempted: the file RUN_DIR/preempt.request (core: stdlib only).

::

    launcher gets the preemption signal          writes RUN_DIR/preempt.request (the signal's name, e.g. "SIGUSR1")
      gyre train (live/launch.py)                  and signals no rank (mpirun's SIGTERM to a rank: a rank was lost)
      the sbatch script (slurm/sbatch.py)          then forwards the signal to the step (srun); it exports SBATCH_ENV
                                                   so that rank 0 knows a SIGTERM without the file is srun's
                                                   teardown after a lost rank (live/lost.py, SrunTeardown)
    rank 0 polls the file (live/preempt.py, Preemption.watch/poll) and, once served, removes it

The shared names live here, in the core, because the sbatch renderer (core) writes them into the script and the
live ranks (edge) read them: one home for each.

Invariants (tests/unit/test_srun_teardown.py)
- The file is written whole before the signal is forwarded (a temporary file, then a rename): a rank that sees
  it reads the signal's name, never an empty file.
- A launcher removes a request an earlier segment left before it starts the ranks, unless the request is its own
  (the signal came before the ranks started).
"""
from __future__ import annotations

#: the file a launcher writes into RUN_DIR when it is preempted (its content: the signal's name)
REQUEST_FILE = "preempt.request"
#: set (to "1") by the sbatch script for the ranks of its steps: their launcher writes REQUEST_FILE before it
#: forwards a preemption signal, so rank 0 can tell srun's teardown SIGTERM from a preemption
SBATCH_ENV = "GYRE_SBATCH_LAUNCHED"
