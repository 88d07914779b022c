"""The live wing: everything that runs in the processes of a live run (docs/runtime.md, docs/architecture.md).

- ``rank``: every rank's dispatch (rank 0 the root, the others their cell); ``launch``: ``gyre train``'s mpirun;
- rank 0: ``root`` (allocator server + proxy + harness + data-plane ``hub``), ``rollouts`` (batches formed by
  ``gyre_hpc.allocator.batches``), ``dataloss``, ``secret``, ``lost``; ``preempt`` for every rank;
- rank c + 1: ``cell_runner`` (role transitions), ``rollout_side``, ``training_side``, ``dataplane``, ``store``.

Invariant (.importlinter): this package imports neither ``gyre_hpc.slurm`` nor ``jobs``; it sits above agents,
proxy, models, engines, train, transfer and the core.
"""
