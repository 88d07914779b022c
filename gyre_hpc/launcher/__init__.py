"""What a launch hands every process it starts; pure (standard library and ``errors`` only), below ``config``.

- ``slurm_options``  the formats of the ``slurm`` config section, checked when the config loads;
- ``openmpi``        Open MPI environment settings for ranks that share one machine (mpirun and sbatch alike);
- ``quiet``          third-party log noise, off unless ``--verbose``: ``GYRE_VERBOSE``, inherited by every child;
- ``listen``         where a run's listeners bind (``cluster.listen_interface``, the bind shim's variable).
"""
