"""What a submitit job of gyre_hpc asks SLURM for: ``AutoExecutor.update_parameters`` keywords from the config.

A training job through submitit runs exactly what ``sbatch/local_4node.sh`` runs (gyre_hpc.slurm.sbatch)::

    #SBATCH --nodes=cells x nodes_per_cell --ntasks-per-node=1 ...      (submitit writes these from the keywords)
    # setup                                                              (slurm_setup, from here)
    export OMPI_...                  slurm.local_cluster's loopback settings, slurm.exports, slurm.setup lines
    SLURM_HOSTFILE=RUN_DIR/hostfile  rank 0 on the first node, then W / node workers on every node, in order
    srun --unbuffered ... --ntasks=1+KW --distribution=arbitrary --overlap --overcommit --mpi=pmix
         --kill-on-bad-exit=1  python -m submitit.core._submit FOLDER   (slurm_srun_args, from here)

so every submitit task is one rank of ONE pmix MPI world, placed as ``Layout.control_srun_args`` places it
(``--distribution=arbitrary`` reads the node of each rank from ``SLURM_HOSTFILE``: submitit quotes srun's
arguments, so the node list cannot be a shell variable on srun's command line).

Invariants (tests/unit/test_jobspec.py)
- Pure: the same config and run directory give the same keywords; the layout is validated (``layout.plan``)
  first, so a layout that does not fit raises ``LayoutError`` and nothing is submitted.
- ``slurm_srun_args`` are ``Layout.control_srun_args()`` without ``--nodelist`` (the hostfile replaces it).
- The hostfile has ``1 + cells x workers per cell`` lines, the rank nodes in rank order (``Layout.rank_nodes`` at run time).
- Local-executor and simulation keywords ask for one node and one task.
- The setup lines carry the bind shim's lines exactly as the sbatch script does (``gyre_hpc.launcher.listen.batch_lines``).
"""
from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from gyre_hpc.launcher import listen
from gyre_hpc.config import GyreConfig
from gyre_hpc.slurm.layout import local_nodes, plan
from gyre_hpc.launcher.slurm_options import parse_signal, time_seconds
from gyre_hpc.slurm.sbatch import LOCAL_EXPORTS, node_count


def timeout_minutes(cfg: GyreConfig) -> int:
    return max(1, math.ceil(time_seconds(cfg.slurm.time) / 60))


def _site(cfg: GyreConfig) -> dict[str, Any]:
    """Partition, account, memory, extra #SBATCH options and job name: shared by every gyre job."""
    s = cfg.slurm
    out: dict[str, Any] = {"name": s.job_name}
    if s.partition:
        out["slurm_partition"] = s.partition
    if s.account:
        out["slurm_account"] = s.account
    if s.mem is not None:
        out["slurm_mem"] = s.mem
    extra = {}
    for entry in s.extra:
        key, sep, value = entry[2:].partition("=")
        extra[key.replace("-", "_")] = value if sep else True
    if extra:
        out["slurm_additional_parameters"] = extra
    return out


def setup_lines(cfg: GyreConfig, run_dir: str | Path) -> list[str]:
    """Shell lines before srun: the environment, the site setup, and the rank placement (SLURM_HOSTFILE)."""
    c, s = cfg.cluster, cfg.slurm
    exports = (LOCAL_EXPORTS if s.local_cluster else ()) + s.exports
    lines = [f"export {k}={shlex.quote(v)}" for k, v in (e.split("=", 1) for e in exports)]
    lines += list(s.setup)
    lines += listen.batch_lines(listen.interface(c.listen_interface, s.local_cluster), shlex.quote(s.python))
    hostfile = shlex.quote(str(Path(run_dir) / "hostfile")) + '-"$SLURM_JOB_ID"'
    lines += [
        "# rank 0 on the first node, then one worker per GPU on every node, in order (gyre_hpc.slurm.layout)",
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f'{{ echo "${{NODES[0]}}"; for N in "${{NODES[@]}}"; do for ((w = 0; w < {c.workers}; w++)); do echo "$N"; '
        f"done; done; }} > {hostfile}",
        f"export SLURM_HOSTFILE={hostfile}",
    ]
    return lines


def train_parameters(cfg: GyreConfig, run_dir: str | Path) -> dict[str, Any]:
    """Keywords of a live training job on SLURM: the allocation, one pmix world of 1 + K tasks."""
    layout = plan(cfg.cluster, local_nodes(cfg.cluster))  # LayoutError before anything is submitted
    srun = [a for a in layout.control_srun_args() if not a.startswith("--nodelist=")]
    _, warn_s = parse_signal(cfg.slurm.signal)  # submitit writes --signal=USR2@warn_s (its own signal: rank_signals)
    params = {**_site(cfg), "timeout_min": timeout_minutes(cfg), "nodes": node_count(cfg), "tasks_per_node": 1,
              "cpus_per_task": cfg.slurm.cpus_per_task, "slurm_srun_args": srun,
              "slurm_setup": setup_lines(cfg, run_dir), "slurm_signal_delay_s": warn_s}
    if cfg.cluster.gpus_per_node:
        params["gpus_per_node"] = cfg.cluster.gpus_per_node
    return params


def single_task_parameters(cfg: GyreConfig, timeout_min: int | None = None) -> dict[str, Any]:
    """Keywords of a one-task job: a simulation element, or the local executor's mpirun launcher."""
    return {**_site(cfg), "timeout_min": timeout_min or timeout_minutes(cfg), "nodes": 1, "tasks_per_node": 1,
            "cpus_per_task": 1}
