"""gyre_hpc: SLURM-native elastic RL for long-horizon coding agents.

The package splits into a pure core (``config``, ``trajectory``, ``allocator`` policies and simulator,
``slurm`` environment parsing and sbatch rendering), which imports only the standard library, numpy and
PyYAML, and edge modules (``train``, ``engines``, ``transfer``, ``live``, ``proxy``) that own torch,
megatron-core, Mooncake, MPI and subprocesses.
"""
__version__ = "0.1.0"

__all__ = ["submit"]


def __getattr__(name: str):
    """``gyre_hpc.submit`` is imported on first use, so ``import gyre_hpc`` stays light (no submitit)."""
    if name == "submit":
        from gyre_hpc.slurm.submit import submit

        return submit
    raise AttributeError(f"module 'gyre_hpc' has no attribute {name!r}")
