"""Cell layout: cells partition the allocation, the allocator and leaders sit where documented, and whatever
does not fit is a LayoutError that names the key and the fix."""
import pytest

from gyre_hpc.config import ClusterConfig
from gyre_hpc.errors import LayoutError
from gyre_hpc.slurm.env import expand_hostlist, from_environ
from gyre_hpc.slurm.layout import ALLOCATOR_RANK, local_nodes, plan, plan_from_env

N4 = ("n1", "n2", "n3", "n4")


def cluster(**kw):
    return ClusterConfig(**{"cells": 2, "nodes_per_cell": 2, **kw})


def test_cells_partition_the_nodes_in_allocation_order():
    layout = plan(cluster(), N4)
    assert [c.nodes for c in layout.cells] == [("n1", "n2"), ("n3", "n4")]
    assert [n for c in layout.cells for n in c.nodes] == list(N4)
    assert [c.index for c in layout.cells] == [0, 1]


def test_allocator_is_an_extra_rank_on_the_first_node_and_leaders_lead_from_their_first_node():
    layout = plan(cluster(cells=4, nodes_per_cell=1), N4)
    assert layout.world_size == 5
    assert layout.rank_nodes == ("n1", "n1", "n2", "n3", "n4")
    allocator = layout.placement(ALLOCATOR_RANK)
    assert allocator.is_allocator and allocator.node == "n1"
    leader = layout.placement(3)
    assert not leader.is_allocator and leader.cell.index == 2 and leader.cell.leader_rank == 3
    with pytest.raises(LayoutError, match="rank 5 is outside the control world of 1 \\+ 4 ranks"):
        layout.placement(5)


def test_srun_arguments_place_every_rank_and_confine_cell_steps():
    layout = plan(cluster(), N4)
    assert layout.control_srun_args() == [
        "--ntasks=3", "--distribution=arbitrary", "--nodelist=n1,n1,n3", "--overlap", "--overcommit", "--mpi=pmix",
        "--kill-on-bad-exit=1"]
    assert layout.cell_srun_args(layout.cells[1]) == [
        "--nodelist=n3,n4", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--exact", "--kill-on-bad-exit=1"]
    assert layout.cell_srun_args(layout.cells[0], tasks_per_node=4)[2:4] == ["--ntasks=8", "--ntasks-per-node=4"]


@pytest.mark.parametrize("nodes, message", [
    (N4 + ("n5", "n6"), r"has 6 nodes but cluster.cells=2 x cluster.nodes_per_cell=2 needs 4; submit with -N4 "
                        r"or set cluster.cells=3"),
    (("n1", "n2"), r"has 2 nodes but .* needs 4; submit with -N4 or set cluster.cells=1"),
    (N4[:3], r"has 3 nodes, not a multiple of cluster.nodes_per_cell=2; submit with -N4"),
    (("n1", "n2", "n1", "n3"), r"node n1 appears twice"),
])
def test_nodes_that_do_not_divide_into_cells_are_rejected_with_the_fix(nodes, message):
    with pytest.raises(LayoutError, match=message):
        plan(cluster(), nodes)


def test_gpu_cells_hold_whole_tensor_x_pipeline_replicas():
    layout = plan(cluster(gpus_per_node=4, tensor_parallel=2, pipeline_parallel=2), N4)
    assert [(c.gpus, c.data_parallel) for c in layout.cells] == [(8, 2), (8, 2)]
    with pytest.raises(LayoutError, match=r"a cell has 8 GPUs .* not a multiple of .* = 2 x 3 = 6"):
        plan(cluster(gpus_per_node=4, tensor_parallel=2, pipeline_parallel=3), N4)
    with pytest.raises(LayoutError, match=r"a cell has 8 GPUs .* = 4 x 4 = 16"):
        plan(cluster(gpus_per_node=4, tensor_parallel=4, pipeline_parallel=4), N4)


def test_tensor_parallelism_stays_inside_a_node():
    with pytest.raises(LayoutError, match=r"cluster.tensor_parallel=8 does not divide cluster.gpus_per_node=4"):
        plan(cluster(gpus_per_node=4, tensor_parallel=8), N4)
    with pytest.raises(LayoutError, match=r"tensor_parallel=3 does not divide"):
        plan(cluster(gpus_per_node=4, tensor_parallel=3), N4)


def test_cpu_cells_are_one_replica_and_skip_gpu_checks():
    layout = plan(cluster(tensor_parallel=3), N4)
    assert [(c.gpus, c.data_parallel) for c in layout.cells] == [(0, 1), (0, 1)]


def test_gpus_from_slurm_must_match_the_config():
    with pytest.raises(LayoutError, match=r"SLURM gave 4 GPUs per node but cluster.gpus_per_node=8; set "
                                          r"cluster.gpus_per_node=4 or submit with --gpus-per-node=8"):
        plan(cluster(gpus_per_node=8), N4, gpus_on_node=4)
    assert plan(cluster(gpus_per_node=4), N4, gpus_on_node=4).cells[0].gpus == 8


def step_env(ntasks, procid, node, nodes="n[1,3]"):
    """The environment of rank ``procid`` of an ``ntasks`` step over ``nodes``, running on ``node``."""
    return from_environ({
        "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_PROCID": str(procid), "SLURMD_NODENAME": node,
        "SLURM_NODEID": str(expand_hostlist(nodes).index(node)),
    })


def test_layout_from_env_uses_the_job_nodes_not_the_step_nodes():
    layout = plan_from_env(cluster(), step_env(3, 2, "n3"))
    assert layout.nodes == N4


def test_a_rank_launched_where_the_layout_says_finds_its_placement():
    layout = plan(cluster(), N4)
    assert layout.placement_from_env(step_env(3, 0, "n1")).is_allocator
    assert layout.placement_from_env(step_env(3, 1, "n1")).cell.index == 0
    assert layout.placement_from_env(step_env(3, 2, "n3")).cell.nodes == ("n3", "n4")


def test_a_rank_launched_elsewhere_or_in_a_wrong_sized_world_fails_with_the_srun_line():
    layout = plan(cluster(), N4)
    with pytest.raises(LayoutError, match=r"the step has 4 tasks but the layout needs 1 allocator \+ 2 cells = 3; "
                                          r"launch with srun --ntasks=3 --distribution=arbitrary --nodelist=n1,n1,n3"):
        layout.placement_from_env(step_env(4, 0, "n1", nodes="n[1-4]"))
    with pytest.raises(LayoutError, match=r"rank 2 runs on n2 but the layout places it on n3"):
        layout.placement_from_env(step_env(3, 2, "n2", nodes="n[1-2]"))


def test_local_nodes_name_one_virtual_node_per_cell_node():
    c = cluster(cells=3, nodes_per_cell=2)
    assert local_nodes(c) == ("local1", "local2", "local3", "local4", "local5", "local6")
    assert plan(c, local_nodes(c)).rank_nodes == ("local1", "local1", "local3", "local5")
