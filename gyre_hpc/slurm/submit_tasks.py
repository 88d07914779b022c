"""The functions submitit runs inside a job (pickled by reference: they must stay importable module functions).

- ``train_rank``: one task of a SLURM training job = one rank of the live run. It takes its rank from
  ``submitit.JobEnvironment()``, checks that it agrees with the MPI world and with the layout's placement of
  that rank, then runs the rank's role through ``gyre train``'s own rank entry point (``gyre_hpc.live.rank``).
  Rank 0 returns the run's summary (summary.json); the other ranks return None.
  With ``allow_preempted`` a rank that stopped for a preemption returns ``Preempted(signal)`` instead (the
  submitit job's ``TrainRank``, gyre_hpc/slurm/submit_requeue.py, then requeues the job). The preemption signals
  are caught from the task's first line (``early_preemption``, before MPI_Init), with their meaning on
  submitit's tasks: SIGTERM, SIGUSR1, and submitit's time-limit signal (gyre_hpc.lifecycle.rank_signals).
- ``train_local``: the local executor's job: ``gyre train``'s mpirun launcher (``gyre_hpc.live.launch``) with
  1 + K x W ranks on this machine, then the summary.
- ``simulate_element``: one ``gyre sweep --simulate`` element: ``compare`` on the element's config, one row.

Invariants
- A rank never runs its role in a world it does not expect: JobEnvironment's (global_rank, num_tasks) must equal
  MPI's (rank, size) and num_tasks must be the layout's world (1 + cells x workers per cell), else ``LayoutError`` saying how it was launched.
- The job reads the config the submitter validated (RUN_DIR/config.yaml, written before submission).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_hpc.config import load_config
from gyre_hpc.errors import GyreError, LayoutError
from gyre_hpc.lifecycle.recovery import PREEMPTED_EXIT

@dataclass(frozen=True)
class Preempted:
    """What ``train_rank`` returns for a rank that stopped for a preemption with the resume state saved."""

    signal: str | None
    """The preemption's signal as this rank noted it (``SIGUSR1``; ``SIGUSR2``: submitit's time-limit warning)."""


def _args(config: str, run_dir: str) -> argparse.Namespace:
    return argparse.Namespace(config=config, overrides=[], run_dir=run_dir, json=False, sync=False, dry_run=False)


def _summary(run_dir: Path, how: str) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise GyreError(f"the live run ended ({how}) without a summary; see {run_dir} (events.jsonl, cells/)")
    return json.loads(path.read_text())


def check_world(job_rank: int, job_tasks: int, mpi_rank: int, mpi_size: int, world_size: int) -> None:
    """The rank submitit reports is the MPI rank, in a world of ``world_size`` ranks (``Layout.world_size``:
    1 allocator + cells x workers per cell)."""
    fix = "submit with gyre_hpc.submit (srun --mpi=pmix, one task per worker: gyre_hpc.slurm.jobspec)"
    if job_tasks != world_size:
        raise LayoutError(f"the job has {job_tasks} tasks but the layout needs {world_size} (1 allocator + "
                          f"cluster.cells x workers per cell); {fix}")
    if (job_rank, job_tasks) != (mpi_rank, mpi_size):
        raise LayoutError(f"submitit says rank {job_rank} of {job_tasks} but MPI says rank {mpi_rank} of "
                          f"{mpi_size}: the tasks did not form one MPI world; {fix}")


def train_rank(config: str, run_dir: str, allow_preempted: bool = False) -> dict[str, Any] | Preempted | None:
    from gyre_hpc.live.rank import early_preemption

    preemption = early_preemption(rank=True)  # before MPI_Init (the mpi4py import) and the heavy imports
    import submitit
    from mpi4py import MPI

    from gyre_hpc.slurm import env as slurm_env
    from gyre_hpc.live.rank import run_rank
    from gyre_hpc.slurm.layout import preflight

    cfg = load_config(config)
    job = submitit.JobEnvironment()
    world = MPI.COMM_WORLD
    env = slurm_env.from_environ()
    layout = preflight(cfg, env.job_nodes, env.gpus_on_node)
    check_world(job.global_rank, job.num_tasks, world.Get_rank(), world.Get_size(), layout.world_size)
    layout.placement_from_env(env)  # on the node the layout gives this rank
    code = run_rank(cfg, _args(config, run_dir), preemption)
    if allow_preempted and code == PREEMPTED_EXIT:
        return Preempted(preemption.signal)
    return _summary(Path(run_dir), "srun") if job.global_rank == 0 else None


def train_local(config: str, run_dir: str) -> dict[str, Any]:
    from gyre_hpc.live.launch import launch
    from gyre_hpc.slurm.layout import preflight

    cfg = load_config(config)
    code = launch(_args(config, run_dir), preflight(cfg).world_size, Path(run_dir),
                  listen_interface=cfg.cluster.listen_interface)
    summary = _summary(Path(run_dir), f"mpirun exit {code}")
    if code != 0:
        raise GyreError(f"mpirun exited with {code}; see {run_dir} (mpirun.log, cells/, traces/)")
    return summary


def simulate_element(config: str | None, overrides: list[str]) -> dict[str, Any]:
    from gyre_hpc.allocator.sim.compare import compare
    from gyre_hpc.allocator.sim.sweep import sim_row

    result, _ = compare(load_config(config, overrides))
    return sim_row(result)
