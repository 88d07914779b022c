"""SLURM: the environment of this process (``env``), the cell layout of an allocation (``layout``), and, as
edge modules added later, sbatch rendering and submitit submission (``submit``).

``env`` and ``layout`` are pure (standard library only): they run and are tested without a cluster.
A real single-machine cluster for the integration tests: ``scripts/local-slurm.sh start`` (docs/slurm-local.md).
"""
