"""SLURM: the environment of this process (``env``), the cell layout of an allocation (``layout``), the sbatch
script rendered from the config (``sbatch``, formats checked in ``gyre_hpc.launcher.slurm_options``), the ``gyre train --dry-run`` report
(``dryrun``), and, as an edge module added later, submitit submission (``submit``).

``env``, ``layout``, ``sbatch``, ``jobspec`` and ``dryrun`` are pure (standard library only): they run and are
tested without a cluster. How to adapt the production scripts: docs/slurm.md.
A real single-machine cluster for the integration tests: ``scripts/local-slurm.sh start`` (docs/slurm-local.md).
"""
