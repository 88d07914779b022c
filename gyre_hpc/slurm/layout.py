"""Cell layout: one allocation -> the allocator rank and K cells of node groups, validated on the CPU first.

Placement (the decision)::

    nodes (SLURM's order)   n1  n2 | n3  n4 | ...            cluster.cells = K, cluster.nodes_per_cell = 2
    cells                   cell 0 | cell 1 | ...            cell k = nodes[k*npc : (k+1)*npc]
    control world (MPI)     rank 0 = allocator on n1         an extra CPU-only task on the first node
                            rank 1 = leader of cell 0 on n1  rank k+1 leads cell k, on its first node
                            rank 2 = leader of cell 1 on n3

The allocator sits on the first node because that is where sbatch runs the batch script; it uses no GPU and
mostly waits on messages, so its world is launched with ``--overlap --overcommit`` and takes no CPU from the
cells' own steps (measured on the local cluster: cell steps started while the control world was running).
One control world::

    srun --ntasks=1+K --distribution=arbitrary --nodelist=n1,n1,n3,... --overlap --overcommit --mpi=pmix
         --kill-on-bad-exit=1                                                   (Layout.control_srun_args())

and each cell's workers as its own concurrent step: ``srun --nodelist=n3,n4 --nodes=2 --ntasks=2
--ntasks-per-node=1 --exact --kill-on-bad-exit=1`` (``cell_srun_args``). ``--kill-on-bad-exit=1`` (whatever the
site's default): a task that dies ends its step at once instead of leaving its peers blocked in MPI, so the control
world fails fast (the job can be requeued) and a cell's step ends where the cell's leader sees it (a lost cell).
Outside SLURM (``mpirun -n 1+K`` on one machine) the cells get virtual node names from ``local_nodes``.

Invariants (a violation is a ``LayoutError`` naming the key that does not fit and how to fix it)
- The cells partition the allocation: every node is in exactly one cell, in allocation order, none unused.
- ``rank_nodes[0] == nodes[0]`` and ``rank_nodes[k + 1] == cells[k].nodes[0]``; ``world_size == 1 + K``.
- With GPUs, tensor parallelism stays inside a node (``tensor_parallel`` divides ``gpus_per_node``) and a
  cell's GPUs are a whole number of ``tensor_parallel x pipeline_parallel`` replicas (``data_parallel >= 1``).
- The GPUs SLURM gave (``SLURM_GPUS_ON_NODE``) equal ``cluster.gpus_per_node`` when SLURM reports them.
- A launched rank is where the layout puts it: world size and ``SLURMD_NODENAME`` are checked per rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gyre_hpc.config import ClusterConfig, GyreConfig
from gyre_hpc.errors import LayoutError
from gyre_hpc.slurm.env import SlurmEnv

ALLOCATOR_RANK = 0


@dataclass(frozen=True)
class Cell:
    """A fixed group of nodes; the unit that changes role."""

    index: int
    nodes: tuple[str, ...]
    leader_rank: int
    gpus: int
    data_parallel: int

    @property
    def nodelist(self) -> str:
        """``"n3,n4"``: what ``srun --nodelist`` takes."""
        return ",".join(self.nodes)


@dataclass(frozen=True)
class Placement:
    """Where one rank of the control world runs and what it does."""

    rank: int
    node: str
    cell: Cell | None

    @property
    def is_allocator(self) -> bool:
        return self.cell is None


@dataclass(frozen=True)
class Layout:
    nodes: tuple[str, ...]
    cells: tuple[Cell, ...]

    @property
    def world_size(self) -> int:
        return 1 + len(self.cells)

    @property
    def rank_nodes(self) -> tuple[str, ...]:
        """Node of each rank of the control world: the allocator's, then each cell leader's."""
        return (self.nodes[0],) + tuple(c.nodes[0] for c in self.cells)

    def placement(self, rank: int) -> Placement:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the control world of 1 + {len(self.cells)} ranks")
        cell = None if rank == ALLOCATOR_RANK else self.cells[rank - 1]
        return Placement(rank, self.rank_nodes[rank], cell)

    def control_srun_args(self) -> list[str]:
        """srun flags that start the control world with every rank on its layout node."""
        return [f"--ntasks={self.world_size}", "--distribution=arbitrary",
                f"--nodelist={','.join(self.rank_nodes)}", "--overlap", "--overcommit", "--mpi=pmix",
                "--kill-on-bad-exit=1"]

    @staticmethod
    def cell_srun_args(cell: Cell, tasks_per_node: int = 1) -> list[str]:
        """srun flags for a step confined to one cell, running beside the other cells' steps (explicit task
        counts: inside a batch script srun would otherwise inherit the job's ``SLURM_NTASKS``)."""
        n = len(cell.nodes)
        return [f"--nodelist={cell.nodelist}", f"--nodes={n}", f"--ntasks={n * tasks_per_node}",
                f"--ntasks-per-node={tasks_per_node}", "--exact", "--kill-on-bad-exit=1"]

    def placement_from_env(self, env: SlurmEnv) -> Placement:
        """This rank's placement, after checking that it was launched as ``control_srun_args`` says."""
        fix = f"launch with srun {' '.join(self.control_srun_args())}"
        if env.ntasks != self.world_size:
            raise LayoutError(f"the step has {env.ntasks} tasks but the layout needs 1 allocator + "
                              f"{len(self.cells)} cells = {self.world_size}; {fix}")
        placed = self.placement(env.proc_id if env.proc_id is not None else -1)
        if env.node_name != placed.node:
            raise LayoutError(f"rank {placed.rank} runs on {env.node_name} but the layout places it on "
                              f"{placed.node}; {fix}")
        return placed


def local_nodes(cluster: ClusterConfig) -> tuple[str, ...]:
    """Virtual node names ``local1..localN`` for one machine without SLURM (``mpirun -n 1+K``)."""
    return tuple(f"local{i + 1}" for i in range(cluster.cells * cluster.nodes_per_cell))


def plan(cluster: ClusterConfig, nodes: Sequence[str], gpus_on_node: int | None = None) -> Layout:
    """Split ``nodes`` into ``cluster.cells`` cells; ``gpus_on_node`` is what SLURM reports, if anything."""
    nodes = tuple(nodes)
    _check_nodes(cluster, nodes)
    replica = cluster.tensor_parallel * cluster.pipeline_parallel
    gpus = cluster.nodes_per_cell * cluster.gpus_per_node
    _check_gpus(cluster, gpus, replica, gpus_on_node)
    npc = cluster.nodes_per_cell
    cells = tuple(Cell(k, nodes[k * npc:(k + 1) * npc], k + 1, gpus, gpus // replica if gpus else 1)
                  for k in range(cluster.cells))
    return Layout(nodes, cells)


def plan_from_env(cluster: ClusterConfig, env: SlurmEnv) -> Layout:
    """The layout of the job this process belongs to (the job's nodes, not the step's)."""
    return plan(cluster, env.job_nodes, env.gpus_on_node)


def _check_nodes(cluster: ClusterConfig, nodes: tuple[str, ...]) -> None:
    need = cluster.cells * cluster.nodes_per_cell
    if len(set(nodes)) != len(nodes):
        dup = next(n for n in nodes if nodes.count(n) > 1)
        raise LayoutError(f"node {dup} appears twice in the allocation {','.join(nodes)}")
    if len(nodes) % cluster.nodes_per_cell:
        raise LayoutError(f"the allocation has {len(nodes)} nodes, not a multiple of cluster.nodes_per_cell="
                          f"{cluster.nodes_per_cell}; submit with -N{need} or change cluster.nodes_per_cell")
    if len(nodes) != need:
        fits = len(nodes) // cluster.nodes_per_cell
        raise LayoutError(f"the allocation has {len(nodes)} nodes but cluster.cells={cluster.cells} x "
                          f"cluster.nodes_per_cell={cluster.nodes_per_cell} needs {need}; submit with -N{need} "
                          f"or set cluster.cells={fits}")


def _check_gpus(cluster: ClusterConfig, gpus: int, replica: int, gpus_on_node: int | None) -> None:
    if gpus_on_node is not None and gpus_on_node != cluster.gpus_per_node:
        raise LayoutError(f"SLURM gave {gpus_on_node} GPUs per node but cluster.gpus_per_node="
                          f"{cluster.gpus_per_node}; set cluster.gpus_per_node={gpus_on_node} or submit with "
                          f"--gpus-per-node={cluster.gpus_per_node}")
    if not cluster.gpus_per_node:
        return
    tp = cluster.tensor_parallel
    if cluster.gpus_per_node % tp:
        raise LayoutError(f"cluster.tensor_parallel={tp} does not divide cluster.gpus_per_node="
                          f"{cluster.gpus_per_node}: tensor parallelism stays inside a node; use a divisor of "
                          f"{cluster.gpus_per_node}")
    if gpus % replica:
        raise LayoutError(f"a cell has {gpus} GPUs (cluster.nodes_per_cell={cluster.nodes_per_cell} x "
                          f"cluster.gpus_per_node={cluster.gpus_per_node}), not a multiple of "
                          f"cluster.tensor_parallel x cluster.pipeline_parallel = {tp} x "
                          f"{cluster.pipeline_parallel} = {replica}; change pipeline_parallel or nodes_per_cell")


def check_live_run(cfg: GyreConfig) -> Layout:
    """Everything a live training run must satisfy before anything is written or submitted: the policy fits the
    cells (``allocator.policies.validate``) and the cells fit a layout (a ``LayoutError`` naming the key)."""
    from gyre_hpc.allocator.policies import validate

    validate(cfg.scheduler.policy, cfg.scheduler, cfg.cluster.cells)
    return plan(cfg.cluster, local_nodes(cfg.cluster))
