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
    assert not leader.is_allocator and leader.cell.index == 2 and leader.cell.leader_rank == 3 and leader.is_leader
    with pytest.raises(LayoutError, match="rank 5 is outside the world of 1 \\+ 4 cells x 1 workers = 5 ranks"):
        layout.placement(5)


def test_every_gpu_runs_one_worker_and_a_cell_leads_from_its_worker_0():
    layout = plan(cluster(gpus_per_node=4, tensor_parallel=2), N4)
    assert layout.world_size == 1 + 2 * 8 and layout.control_size == 3
    workers = [layout.placement(r) for r in range(1, layout.world_size)]
    assert sorted((p.node, p.gpu) for p in workers) == [(n, g) for n in N4 for g in range(4)]
    assert [c.leader_rank for c in layout.cells] == [1, 9] and layout.placement(9).is_leader
    assert [(p.tp_rank, p.dp_rank) for p in workers[:8]] == [(i % 2, i // 2) for i in range(8)]
    groups = {}
    for p in workers:  # a tensor-parallel group never spans two nodes
        groups.setdefault((p.cell.index, p.dp_rank, p.pp_rank), set()).add(p.node)
    assert all(len(nodes) == 1 for nodes in groups.values()) and len(groups) == 8


def test_cpu_cells_emulate_gpus_with_workers_per_node():
    layout = plan(cluster(workers_per_node=2, tensor_parallel=2), N4)
    assert layout.world_size == 9 and layout.rank_nodes == ("n1",) + tuple(n for n in N4 for _ in range(2))
    assert [(c.workers, c.data_parallel) for c in layout.cells] == [(4, 2), (4, 2)]
    rows = layout.ranks()
    assert rows[0]["role"] == "allocator" and rows[0]["gpu"] is None
    assert [r["gpu"] for r in rows[1:5]] == [0, 1, 0, 1] and {r["cell"] for r in rows[5:]} == {1}


def test_srun_arguments_place_every_worker():
    layout = plan(cluster(workers_per_node=2), N4)
    assert layout.control_srun_args() == [
        "--ntasks=9", "--distribution=arbitrary", "--nodelist=n1,n1,n1,n2,n2,n3,n3,n4,n4", "--overlap",
        "--overcommit", "--mpi=pmix", "--kill-on-bad-exit=1"]


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


def test_cpu_cells_hold_whole_replicas_of_their_emulated_gpus():
    assert [(c.gpus, c.data_parallel) for c in plan(cluster(), N4).cells] == [(0, 2), (0, 2)]
    with pytest.raises(LayoutError, match=r"cluster.tensor_parallel=3 does not divide the 1 workers per node"):
        plan(cluster(tensor_parallel=3), N4)


def test_gpus_from_slurm_must_match_the_config():
    with pytest.raises(LayoutError, match=r"SLURM gave 4 GPUs per node but cluster.gpus_per_node=8; set "
                                          r"cluster.gpus_per_node=4 or submit with --gpus-per-node=8"):
        plan(cluster(gpus_per_node=8), N4, gpus_on_node=4)
    assert plan(cluster(gpus_per_node=4), N4, gpus_on_node=4).cells[0].gpus == 8


def step_env(ntasks, procid, node, nodes="n[1-4]"):
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
    assert layout.placement_from_env(step_env(5, 0, "n1")).is_allocator
    assert layout.placement_from_env(step_env(5, 1, "n1")).cell.index == 0
    assert layout.placement_from_env(step_env(5, 2, "n2")).worker == 1
    assert layout.placement_from_env(step_env(5, 3, "n3")).cell.nodes == ("n3", "n4")


def test_a_rank_launched_elsewhere_or_in_a_wrong_sized_world_fails_with_the_srun_line():
    layout = plan(cluster(), N4)
    with pytest.raises(LayoutError, match=r"the step has 4 tasks but the layout needs 1 allocator \+ 2 cells x 2 "
                                          r"workers = 5; launch with srun --ntasks=5 --distribution=arbitrary "
                                          r"--nodelist=n1,n1,n2,n3,n4"):
        layout.placement_from_env(step_env(4, 0, "n1", nodes="n[1-4]"))
    with pytest.raises(LayoutError, match=r"rank 3 runs on n2 but the layout places it on n3"):
        layout.placement_from_env(step_env(5, 3, "n2", nodes="n[1-2]"))


def test_local_nodes_name_one_virtual_node_per_cell_node():
    c = cluster(cells=3, nodes_per_cell=2)
    assert local_nodes(c) == ("local1", "local2", "local3", "local4", "local5", "local6")
    assert plan(c, local_nodes(c)).rank_nodes == ("local1",) + local_nodes(c)


def live(**sets):
    from gyre_hpc.config import load_config

    return load_config("configs/local.yaml", [f"{k}={v}" for k, v in sets.items()])


@pytest.mark.parametrize("sets, message", [
    ({"cluster.workers_per_node": 4, "cluster.tensor_parallel": 4, "model.kv_heads": 2},
     r"^cluster.tensor_parallel=4 does not divide model.kv_heads=2: .*use a divisor of 2$"),
    ({"cluster.workers_per_node": 2, "cluster.tensor_parallel": 2, "model.vocab_size": 513},
     r"^cluster.tensor_parallel=2 does not divide model.vocab_size=513: .*pad model.vocab_size"),
    ({"cluster.workers_per_node": 2, "cluster.pipeline_parallel": 2, "model.layers": 3},
     r"^cluster.pipeline_parallel=2 does not divide model.layers=3"),
    ({"cluster.workers_per_node": 2, "cluster.pipeline_parallel": 2}, r"^cluster.pipeline_parallel=2: the live "
                                                                      r"trainer runs no pipeline schedule yet"),
    ({"cluster.workers_per_node": 2, "engine.tp": 2}, r"^engine.tp=2: the local engine has no tensor parallelism"),
    ({"cluster.workers_per_node": 3, "engine.tp": 2, "engine.kind": "sglang"}, r"^engine.tp=2 does not divide the 3"),
    ({"cluster.workers_per_node": 2, "cluster.tensor_parallel": 4}, r"^cluster.tensor_parallel=4 does not divide the "
                                                                    r"2 workers per node"),
])
def test_preflight_refuses_every_geometry_the_model_or_engines_cannot_take_in_one_line(sets, message):
    from gyre_hpc.slurm.layout import preflight

    with pytest.raises(LayoutError, match=message) as info:
        preflight(live(**sets))
    assert "\n" not in str(info.value)


def test_preflight_passes_a_fitting_layout_and_gives_its_world():
    from gyre_hpc.slurm.layout import preflight

    cfg = live(**{"cluster.workers_per_node": 2, "cluster.tensor_parallel": 2, "cluster.nodes_per_cell": 2})
    assert preflight(cfg).world_size == 1 + 4 * 4
    with pytest.raises(LayoutError, match="has 4 nodes but .* needs 8"):
        preflight(cfg, nodes=("a", "b", "c", "d"))


def test_preflight_takes_expert_parallel_only_as_a_whole_cell_naming_the_key_otherwise():
    from gyre_hpc.slurm.layout import preflight

    moe = {"model.experts": 4, "model.experts_topk": 2, "model.moe_ffn": 32, "train.expert_parallel": 2}
    with pytest.raises(LayoutError, match=r"^train.expert_parallel=2 must equal the 1 workers of a cell"):
        preflight(live(**moe))  # one worker per cell: no expert-parallel group to build
    two = live(**moe, **{"cluster.workers_per_node": 2})
    assert preflight(two).world_size == 1 + two.cluster.cells * 2
