"""Engine replicas of a rollout cell: how many, on which GPUs, under which proxy names and ports. Pure (stdlib).

A rollout cell's workers serve together as ``engine.tp``-wide engine replicas::

    cell workers   W = nodes_per_cell x workers_per_node          (one per GPU; emulated on CPU cells)
    replicas       R = W / engine.tp                              (engine.tp divides workers_per_node)
    replica r      node r // (workers_per_node / tp) of the cell, local GPUs [(r mod per_node) tp, ... + tp)

e.g. 2 nodes x 8 GPUs, engine.tp 4: replicas 0, 1 on node 0 (GPUs 0-3, 4-7), replicas 2, 3 on node 1.

On a CPU-only cell (``gpus_per_node`` 0) a replica has no GPUs: it is one more engine process on its own port,
and ``workers_per_node`` emulates the GPUs it would hold. SGLang's CPU backend serves ``--tp-size 2`` (measured:
docs/engines.md; its ranks get their own cores, ``engines.launch.omp_bind``); the local engine has no tensor
parallelism, so ``engine.tp > 1`` with ``engine.kind: local`` is refused.

Invariants (tests/unit/test_replicas.py)
- ``replicas_per_cell(cluster, engine) * engine.tp == cluster.workers_per_cell``; a ``tp`` that does not divide the workers
  of one node, or one the engine cannot serve, is a ``ConfigError`` naming ``engine.tp``, in one line.
- The replicas of a cell hold disjoint GPU slices that cover every GPU of the cell exactly once, each inside one node.
- ``replica_name`` is ``cell<c>-e<start>`` (``w<wake>`` after a wake) with one replica: exactly the single-engine
  names; with several, ``cell<c>-r<r>-e<start>``: distinct across cells, replicas, starts and wakes.
- ``port_index(cell, replica, replicas)`` differs for every (cell, replica) pair (``engine.port_base + i``), so
  fixed ports never collide across cells and replicas.
"""
from __future__ import annotations

from dataclasses import dataclass

from gyre_hpc.config import ClusterConfig, EngineConfig
from gyre_hpc.errors import ConfigError


@dataclass(frozen=True)
class ReplicaSpec:
    """Replica ``index`` of a cell: on node ``node`` of the cell (its index there), local GPUs ``gpus`` (empty on CPU)."""

    index: int
    node: int = 0
    gpus: tuple[int, ...] = ()

    def visible_devices(self, parent: str | None = None) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` for the replica's server: its local GPUs, mapped through the caller's own
        ``CUDA_VISIBLE_DEVICES`` (``parent``, as SLURM sets it for a step) when set; None without GPUs."""
        if not self.gpus:
            return None
        ids = [p.strip() for p in parent.split(",") if p.strip()] if parent else None
        if ids is not None and max(self.gpus) >= len(ids):
            raise ConfigError(f"engine.tp: replica {self.index} needs local GPUs {list(self.gpus)} but "
                              f"CUDA_VISIBLE_DEVICES={parent!r} shows {len(ids)}")
        return ",".join(ids[g] if ids is not None else str(g) for g in self.gpus)


def tp_refusal(cluster: ClusterConfig, engine: EngineConfig) -> str | None:
    """Why ``engine.tp`` cannot be served in this geometry (one line, naming the key), or None; the one rule for it
    (the pre-flight check, ``slurm.layout.geometry_problems``, asks it too)."""
    if engine.tp > 1 and engine.kind == "local":
        return (f"engine.tp={engine.tp}: the local engine has no tensor parallelism; use engine.tp 1 (each worker "
                f"serves its own replica) or engine.kind sglang")
    if cluster.workers % engine.tp:
        return (f"engine.tp={engine.tp} does not divide the {cluster.workers} workers per node "
                f"(cluster.workers_per_node): an engine replica's GPUs are on one node")
    return None


def replicas_per_cell(cluster: ClusterConfig, engine: EngineConfig) -> int:
    """Engine replicas a rollout cell serves (``workers_per_cell / engine.tp``); ``ConfigError`` when the geometry
    or the engine cannot serve ``engine.tp``."""
    problem = tp_refusal(cluster, engine)
    if problem is not None:
        raise ConfigError(problem)
    return cluster.workers_per_cell // engine.tp


def replica_specs(cluster: ClusterConfig, engine: EngineConfig) -> list[ReplicaSpec]:
    """Every replica of one rollout cell, in order: its node in the cell and its local GPU slice (none on CPU)."""
    count = replicas_per_cell(cluster, engine)
    if cluster.gpus_per_node == 0:
        return [ReplicaSpec(r) for r in range(count)]
    per_node = cluster.workers // engine.tp
    return [ReplicaSpec(r, r // per_node, tuple(range((r % per_node) * engine.tp, (r % per_node + 1) * engine.tp)))
            for r in range(count)]


def leader_replicas(cluster: ClusterConfig, engine: EngineConfig) -> list[ReplicaSpec]:
    """The replicas a cell's leader launches: all of them on CPU-only cells (their emulated nodes are this
    machine), those on the cell's first node with GPUs (another node's are launched by its first worker)."""
    specs = replica_specs(cluster, engine)
    return specs if cluster.gpus_per_node == 0 else [s for s in specs if s.node == 0]


def replica_name(cell: int, replica: int, replicas: int, start: int, wake: int = 0) -> str:
    """The proxy name of a replica's ``start``-th process (after its ``wake``-th wake)."""
    base = f"cell{cell}-e{start}" if replicas == 1 else f"cell{cell}-r{replica}-e{start}"
    return f"{base}w{wake}" if wake else base


def port_index(cell: int, replica: int, replicas: int) -> int:
    """``i`` of ``engine.port_base + i`` for a fixed-port replica: one per (cell, replica), never shared."""
    if not 0 <= replica < replicas:
        raise ValueError(f"replica {replica} is not one of the cell's {replicas}")
    return cell * replicas + replica
