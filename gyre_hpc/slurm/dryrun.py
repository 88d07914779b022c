"""What ``gyre train CONFIG --dry-run`` prints: the layout and the launch commands, touching no device.

Invariants
- Pure text from (layout, cluster, commands): nothing is started, no device or MPI library is imported.
- One line per rank of the control world (which node, allocator or which cell) and one per cell (its nodes, its
  GPUs, its data-parallel replicas), in rank order, followed by the commands verbatim (shell-quoted).
"""
from __future__ import annotations

import shlex
from typing import Sequence

from gyre_hpc.config import ClusterConfig
from gyre_hpc.slurm.layout import Layout


def describe(layout: Layout, cluster: ClusterConfig, source: str, commands: Sequence[Sequence[str]]) -> str:
    """The dry-run report; ``source`` says where the node names came from (SLURM job or local names)."""
    gpus = (f"{cluster.gpus_per_node} GPUs per node, TP {cluster.tensor_parallel} x PP "
            f"{cluster.pipeline_parallel}" if cluster.gpus_per_node else "CPU only")
    lines = [f"layout ({source}): {len(layout.nodes)} nodes, {len(layout.cells)} cells x "
             f"{cluster.nodes_per_cell} node(s), {gpus}; control world of {layout.world_size} ranks"]
    for rank in range(layout.world_size):
        p = layout.placement(rank)
        role = "allocator (CPU only)" if p.is_allocator else f"leader of cell {p.cell.index}"
        lines.append(f"  rank {rank} on {p.node}: {role}")
    for c in layout.cells:
        lines.append(f"  cell {c.index}: nodes {c.nodelist}; {c.gpus} GPUs, {c.data_parallel} replica(s)")
    lines.append("commands:")
    lines += ["  " + shlex.join(cmd) for cmd in commands]
    return "\n".join(lines) + "\n"
