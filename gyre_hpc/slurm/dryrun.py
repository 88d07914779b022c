"""What ``gyre train CONFIG --dry-run`` prints: the layout and the launch commands, touching no device.

Invariants
- Pure text from (layout, cluster, commands): nothing is started, no device or MPI library is imported.
- One line for the allocator and one per cell (its ranks, nodes, workers, GPUs, data-parallel replicas), then one
  per worker for small cells, the pre-flight verdict, and the commands verbatim (shell-quoted).
- ``as_json`` lists every process of the world exactly once, in rank order.
"""
from __future__ import annotations

import shlex
from typing import Sequence

from gyre_hpc.config import ClusterConfig
from gyre_hpc.slurm.layout import Layout

MAX_LISTED = 16  # cells of at most this many workers list each worker in the text report (--json lists all)


def describe(layout: Layout, cluster: ClusterConfig, source: str, commands: Sequence[Sequence[str]],
             problems: Sequence[str] = ()) -> str:
    """The dry-run report; ``source`` says where the node names came from (SLURM job or local names);
    ``problems``: what the pre-flight check refuses (``layout.geometry_problems``)."""
    gpus = f"{cluster.gpus_per_node} GPUs per node" if cluster.gpus_per_node else "CPU only"
    lines = [f"layout ({source}): {len(layout.nodes)} nodes, {len(layout.cells)} cells x "
             f"{cluster.nodes_per_cell} node(s), {gpus}, {layout.workers_per_cell} worker(s) per cell, TP "
             f"{layout.tensor_parallel} x PP {layout.pipeline_parallel} x DP {layout.cells[0].data_parallel}; world "
             f"of {layout.world_size} ranks"]
    lines.append(f"  rank 0 on {layout.nodes[0]}: allocator (CPU only)")
    for c in layout.cells:
        first, last = c.ranks[0], c.ranks[-1]
        lines.append(f"  cell {c.index}: ranks {first}-{last} on {c.nodelist} (leader: rank {first}); "
                     f"{c.workers} worker(s), {c.gpus} GPUs, {c.data_parallel} training replica(s)")
    if len(layout.cells) and layout.workers_per_cell <= MAX_LISTED:
        for rank in range(1, layout.world_size):
            p = layout.placement(rank)
            lines.append(f"    rank {rank} on {p.node}: cell {p.cell.index} worker {p.worker} gpu {p.gpu} "
                         f"(tp {p.tp_rank}, pp {p.pp_rank}, dp {p.dp_rank})" + (" leader" if p.is_leader else ""))
    lines += [f"pre-flight: refused: {p}" for p in problems] or ["pre-flight: ok"]
    lines.append("commands:")
    lines += ["  " + shlex.join(cmd) for cmd in commands]
    return "\n".join(lines) + "\n"


def as_json(layout: Layout, cluster: ClusterConfig, engine_tp: int, source: str,
            commands: Sequence[Sequence[str]], problems: Sequence[str] = ()) -> dict:
    """The same as data: every process of the world in ``ranks`` (``role``, ``cell``, ``node``, ``gpu``,
    ``tp_rank``, ``pp_rank``, ``dp_rank``), the cells, the pre-flight verdict and the commands."""
    return {"source": source, "world_size": layout.world_size, "nodes": len(layout.nodes),
            "gpus_per_node": cluster.gpus_per_node, "workers_per_cell": layout.workers_per_cell,
            "parallel": {"tp": layout.tensor_parallel, "pp": layout.pipeline_parallel,
                         "dp": layout.cells[0].data_parallel, "engine_tp": engine_tp,
                         "engine_replicas_per_cell": layout.workers_per_cell // engine_tp},
            "cells": [{"cell": c.index, "nodes": list(c.nodes), "leader_rank": c.leader_rank, "workers": c.workers,
                       "gpus": c.gpus, "data_parallel": c.data_parallel} for c in layout.cells],
            "ranks": layout.ranks(), "preflight": list(problems), "commands": [list(c) for c in commands]}
