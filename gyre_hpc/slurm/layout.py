"""Cell layout: one allocation -> the allocator rank and K cells of workers (one per GPU), validated on the CPU first.

Placement (the decision)::

    nodes (SLURM's order)   n1  n2 | n3  n4 | ...            cluster.cells = K, cluster.nodes_per_cell = 2
    cells                   cell 0 | cell 1 | ...            cell k = nodes[k*npc : (k+1)*npc]
    world (one MPI world)   rank 0 = allocator on n1         an extra CPU-only task on the first node
                            ranks 1 .. W   = cell 0's workers, W = nodes_per_cell x workers per node (one per GPU)
                            ranks 1 + kW .. kW + W = cell k's workers, node by node, GPU by GPU
    leaders                 worker 0 of each cell (rank 1 + kW) leads it: the control world (allocator + K
                            leaders) is a sub-communicator of the one world (gyre_hpc.live.workers)

Inside a cell, worker i holds (megatron's rank order, tensor-parallel fastest)::

    tp_rank = i % TP        dp_rank = (i // TP) % DP        pp_rank = i // (TP x DP)        DP = W / (TP x PP)

so a tensor-parallel group is TP consecutive GPUs of one node. A rollout cell serves W / engine.tp engine replicas,
replica r on workers [r tp, (r+1) tp) (the same node).

The allocator sits on the first node because that is where sbatch runs the batch script; it uses no GPU and
mostly waits on messages, so the one step is launched with ``--overlap --overcommit`` and its extra task takes no
CPU from the cells' own work. One step holds every process::

    srun --ntasks=1+KW --distribution=arbitrary --nodelist=n1,n1,n1,n2,n2,n3,... --overlap --overcommit
         --mpi=pmix --kill-on-bad-exit=1                                       (Layout.control_srun_args())

``--kill-on-bad-exit=1`` (whatever the site's default): a task that dies ends its step at once instead of leaving
its peers blocked in MPI, so the world fails fast (the job can be relaunched or requeued). Outside SLURM
(``mpirun -n 1+KW`` on one machine) the cells get virtual node names from ``local_nodes``.

Invariants (a violation is a ``LayoutError`` naming the key that does not fit and how to fix it)
- The cells partition the allocation: every node is in exactly one cell, in allocation order, none unused.
- Every (node, GPU) pair of the allocation holds exactly one worker; ``world_size == 1 + K x W``.
- ``rank_nodes[0] == nodes[0]``; a cell's leader is its worker 0, on the cell's first node.
- Tensor parallelism stays inside a node (``tensor_parallel`` and ``engine.tp`` divide the workers per node) and a
  cell's workers are a whole number of ``tensor_parallel x pipeline_parallel`` replicas (``data_parallel >= 1``).
- The GPUs SLURM gave (``SLURM_GPUS_ON_NODE``) equal ``cluster.gpus_per_node`` when SLURM reports them.
- A launched rank is where the layout puts it: world size and ``SLURMD_NODENAME`` are checked per rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gyre_hpc.config import ClusterConfig, EngineConfig, GyreConfig, ModelConfig, TrainConfig
from gyre_hpc.errors import LayoutError
from gyre_hpc.replicas import tp_refusal
from gyre_hpc.slurm.env import SlurmEnv

ALLOCATOR_RANK = 0


@dataclass(frozen=True)
class Cell:
    """A fixed group of nodes and their workers (one per GPU); the unit that changes role."""

    index: int
    nodes: tuple[str, ...]
    leader_rank: int
    gpus: int
    data_parallel: int
    workers_per_node: int = 1

    @property
    def nodelist(self) -> str:
        """``"n3,n4"``: what ``srun --nodelist`` takes."""
        return ",".join(self.nodes)

    @property
    def workers(self) -> int:
        return len(self.nodes) * self.workers_per_node

    @property
    def ranks(self) -> range:
        """World ranks of the cell's workers; the first is the leader."""
        return range(self.leader_rank, self.leader_rank + self.workers)


@dataclass(frozen=True)
class Placement:
    """Where one rank of the world runs and what it does: the allocator, or worker ``worker`` of ``cell``."""

    rank: int
    node: str
    cell: Cell | None
    worker: int | None = None
    gpu: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    dp_rank: int | None = None

    @property
    def is_allocator(self) -> bool:
        return self.cell is None

    @property
    def is_leader(self) -> bool:
        return self.worker == 0

    def to_dict(self) -> dict:
        return {"rank": self.rank, "role": "allocator" if self.is_allocator else "worker",
                "cell": None if self.cell is None else self.cell.index, "node": self.node, "gpu": self.gpu,
                "worker": self.worker, "leader": self.is_leader, "tp_rank": self.tp_rank, "pp_rank": self.pp_rank,
                "dp_rank": self.dp_rank}


@dataclass(frozen=True)
class Layout:
    nodes: tuple[str, ...]
    cells: tuple[Cell, ...]
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    @property
    def workers_per_cell(self) -> int:
        return self.cells[0].workers if self.cells else 0

    @property
    def world_size(self) -> int:
        return 1 + len(self.cells) * self.workers_per_cell

    @property
    def control_size(self) -> int:
        """The allocator and one leader per cell: the world the allocator protocol runs on."""
        return 1 + len(self.cells)

    @property
    def rank_nodes(self) -> tuple[str, ...]:
        """Node of each rank of the world: the allocator's, then every cell's workers, node by node."""
        return (self.nodes[0],) + tuple(n for c in self.cells for n in c.nodes for _ in range(c.workers_per_node))

    def placement(self, rank: int) -> Placement:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the world of 1 + {len(self.cells)} cells x "
                              f"{self.workers_per_cell} workers = {self.world_size} ranks")
        if rank == ALLOCATOR_RANK:
            return Placement(rank, self.nodes[0], None)
        cell = self.cells[(rank - 1) // self.workers_per_cell]
        i = rank - cell.leader_rank
        tp, dp = self.tensor_parallel, cell.data_parallel
        return Placement(rank, cell.nodes[i // cell.workers_per_node], cell, worker=i,
                         gpu=i % cell.workers_per_node, tp_rank=i % tp, dp_rank=(i // tp) % dp,
                         pp_rank=i // (tp * dp))

    def ranks(self) -> list[dict]:
        """Every process of the world as data (``gyre train --dry-run --json``)."""
        return [self.placement(r).to_dict() for r in range(self.world_size)]

    def control_srun_args(self) -> list[str]:
        """srun flags that start the whole world (allocator + every worker) with every rank on its layout node."""
        return [f"--ntasks={self.world_size}", "--distribution=arbitrary",
                f"--nodelist={','.join(self.rank_nodes)}", "--overlap", "--overcommit", "--mpi=pmix",
                "--kill-on-bad-exit=1"]

    def placement_from_env(self, env: SlurmEnv) -> Placement:
        """This rank's placement, after checking that it was launched as ``control_srun_args`` says."""
        fix = f"launch with srun {' '.join(self.control_srun_args())}"
        if env.ntasks != self.world_size:
            raise LayoutError(f"the step has {env.ntasks} tasks but the layout needs 1 allocator + "
                              f"{len(self.cells)} cells x {self.workers_per_cell} workers = {self.world_size}; {fix}")
        placed = self.placement(env.proc_id if env.proc_id is not None else -1)
        if env.node_name != placed.node:
            raise LayoutError(f"rank {placed.rank} runs on {env.node_name} but the layout places it on "
                              f"{placed.node}; {fix}")
        return placed


def local_nodes(cluster: ClusterConfig) -> tuple[str, ...]:
    """Virtual node names ``local1..localN`` for one machine without SLURM (``mpirun -n 1+KW``)."""
    return tuple(f"local{i + 1}" for i in range(cluster.cells * cluster.nodes_per_cell))


def plan(cluster: ClusterConfig, nodes: Sequence[str], gpus_on_node: int | None = None) -> Layout:
    """Split ``nodes`` into ``cluster.cells`` cells; ``gpus_on_node`` is what SLURM reports, if anything."""
    nodes = tuple(nodes)
    _check_nodes(cluster, nodes)
    replica = cluster.tensor_parallel * cluster.pipeline_parallel
    gpus = cluster.nodes_per_cell * cluster.gpus_per_node
    _check_gpus(cluster, gpus, replica, gpus_on_node)
    _check_workers(cluster, replica)
    npc, w = cluster.nodes_per_cell, cluster.workers_per_cell
    cells = tuple(Cell(k, nodes[k * npc:(k + 1) * npc], 1 + k * w, gpus, w // replica, cluster.workers)
                  for k in range(cluster.cells))
    return Layout(nodes, cells, cluster.tensor_parallel, cluster.pipeline_parallel)


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


def _check_workers(cluster: ClusterConfig, replica: int) -> None:
    """The workers (emulated GPUs on CPU cells) hold whole TP x PP replicas, TP inside a node."""
    w, tp = cluster.workers, cluster.tensor_parallel
    if w % tp:
        raise LayoutError(f"cluster.tensor_parallel={tp} does not divide the {w} workers per node "
                          f"(cluster.workers_per_node): tensor parallelism stays inside a node; use a divisor of {w}")
    if cluster.workers_per_cell % replica:
        raise LayoutError(f"a cell has {cluster.workers_per_cell} workers (cluster.nodes_per_cell="
                          f"{cluster.nodes_per_cell} x {w} per node), not a multiple of cluster.tensor_parallel x "
                          f"cluster.pipeline_parallel = {tp} x {cluster.pipeline_parallel} = {replica}")


def preflight(cfg: GyreConfig, nodes: Sequence[str] | None = None, gpus_on_node: int | None = None) -> Layout:
    """The one pre-flight check of a live run, made by every entry point (train, submit, sweep, gyre_hpc.submit)
    before anything is written, submitted or started: the policy fits the cells, the cells fit the allocation
    (``nodes``: SLURM's, else local names) and every geometry key fits the model and the engines. The first
    problem is a ``LayoutError`` of one line naming the dotted key; no geometry key is accepted and then unused."""
    from gyre_hpc.allocator.policies import validate

    validate(cfg.scheduler.policy, cfg.scheduler, cfg.cluster.cells)
    layout = plan(cfg.cluster, local_nodes(cfg.cluster) if nodes is None else nodes, gpus_on_node)
    for problem in geometry_problems(cfg.cluster, cfg.model, cfg.engine, cfg.train):
        raise LayoutError(problem)
    return layout


def geometry_problems(c: ClusterConfig, m: ModelConfig, e: EngineConfig, t: TrainConfig | None = None) -> list[str]:
    """What in the parallel layout the model, the trainer or the engines cannot take, one line each (empty: it
    fits)."""
    tp, pp = c.tensor_parallel, c.pipeline_parallel
    sizes = {"heads": m.heads, "kv_heads": m.heads if m.kv_heads is None else m.kv_heads, "vocab_size": m.vocab_size}
    out = [f"cluster.tensor_parallel={tp} does not divide model.{key}={sizes[key]}: every tensor-parallel rank "
           f"holds whole {what}; use a divisor of {sizes[key]}"
           for key, what in (("heads", "attention heads"), ("kv_heads", "key/value head groups"),
                             ("vocab_size", "vocabulary rows (pad model.vocab_size to a multiple of it)"))
           if sizes[key] % tp]
    if m.layers % pp:
        out.append(f"cluster.pipeline_parallel={pp} does not divide model.layers={m.layers}: every stage holds "
                   f"whole layers")
    if pp > 1:
        out.append(f"cluster.pipeline_parallel={pp}: the live trainer runs no pipeline schedule yet (megatron's "
                   f"schedules need CUDA, docs/architecture.md); use 1 and scale with tensor_parallel and cells")
    if t is not None and t.expert_parallel > 1 and t.expert_parallel != c.workers_per_cell:
        out.append(f"train.expert_parallel={t.expert_parallel} must equal the {c.workers_per_cell} workers of a cell "
                   f"(cluster.nodes_per_cell x workers_per_node): expert parallel feeds every rank of its group the "
                   f"same rows, so a cell's training world is exactly one expert-parallel group")
    engine_tp = tp_refusal(c, e)
    return out + ([engine_tp] if engine_tp else [])
