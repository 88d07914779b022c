"""Engine replicas of a rollout cell (gyre_hpc/replicas.py): count, GPU slices, names, ports; the launch's TP flags."""
import itertools

import pytest

from gyre_hpc.config import ClusterConfig, EngineConfig, load_config
from gyre_hpc.errors import ConfigError, EngineError
from gyre_hpc.replicas import (ReplicaSpec, leader_replicas, port_index, replica_name, replica_specs,
                               replicas_per_cell, tp_refusal)


def test_a_cpu_cell_serves_one_replica_per_emulated_worker():
    assert replicas_per_cell(ClusterConfig(), EngineConfig()) == 1  # the single-engine default
    two = ClusterConfig(workers_per_node=2)
    assert replicas_per_cell(two, EngineConfig()) == 2
    assert replica_specs(two, EngineConfig()) == [ReplicaSpec(0), ReplicaSpec(1)]  # no GPUs on CPU cells
    assert replicas_per_cell(ClusterConfig(workers_per_node=2, nodes_per_cell=2), EngineConfig()) == 4
    assert leader_replicas(ClusterConfig(workers_per_node=2, nodes_per_cell=2), EngineConfig()) == \
        replica_specs(ClusterConfig(workers_per_node=2, nodes_per_cell=2), EngineConfig())  # one machine


@pytest.mark.parametrize("nodes,gpus,tp", [(1, 8, 1), (1, 8, 2), (2, 8, 4), (3, 4, 4), (2, 8, 8)])
def test_replicas_times_tp_is_the_cells_workers_and_their_gpu_slices_cover_each_gpu_once(nodes, gpus, tp):
    cluster, engine = ClusterConfig(nodes_per_cell=nodes, gpus_per_node=gpus), EngineConfig(kind="sglang", tp=tp)
    specs = replica_specs(cluster, engine)
    assert len(specs) * tp == cluster.workers_per_cell == nodes * gpus
    held = [(s.node, g) for s in specs for g in s.gpus]
    assert sorted(held) == [(n, g) for n in range(nodes) for g in range(gpus)]  # each (node, GPU) exactly once
    assert all(len(s.gpus) == tp and list(s.gpus) == list(range(s.gpus[0], s.gpus[0] + tp)) for s in specs)
    assert [s.index for s in specs] == list(range(len(specs)))
    assert leader_replicas(cluster, engine) == [s for s in specs if s.node == 0]


def test_visible_devices_name_the_replicas_gpus_through_the_steps_own_list():
    spec = ReplicaSpec(1, 0, (2, 3))
    assert spec.visible_devices() == "2,3"
    assert spec.visible_devices("4,5,6,7") == "6,7"  # SLURM gave the step GPUs 4-7: local 2, 3 are 6, 7
    assert ReplicaSpec(0).visible_devices("0,1") is None  # a CPU replica leaves the GPUs alone
    with pytest.raises(ConfigError, match="engine.tp"):
        spec.visible_devices("0,1")


def test_an_engine_tp_that_cannot_be_served_is_refused_in_one_line_naming_the_key():
    cases = [(ClusterConfig(workers_per_node=2), EngineConfig(tp=2), "local engine has no tensor parallelism"),
             (ClusterConfig(gpus_per_node=8), EngineConfig(kind="sglang", tp=3), "does not divide the 8 workers per node"),
             (ClusterConfig(workers_per_node=2), EngineConfig(kind="sglang", tp=4), "does not divide the 2")]
    for cluster, engine, why in cases:
        with pytest.raises(ConfigError, match=why) as err:
            replicas_per_cell(cluster, engine)
        assert str(err.value).startswith(f"engine.tp={engine.tp}") and "\n" not in str(err.value)
    # SGLang on CPU serves --tp-size 2 (docs/engines.md): two emulated workers make one TP-2 replica
    assert tp_refusal(ClusterConfig(workers_per_node=2), EngineConfig(kind="sglang", tp=2)) is None
    assert replicas_per_cell(ClusterConfig(workers_per_node=2), EngineConfig(kind="sglang", tp=2)) == 1


def test_engine_tp_is_a_config_key_with_a_floor():
    assert load_config(None, ["engine.tp=2"]).engine.tp == 2
    with pytest.raises(ConfigError, match="engine.tp"):
        load_config(None, ["engine.tp=0"])


def test_names_keep_the_single_engine_form_and_differ_across_cells_replicas_starts_and_wakes():
    assert replica_name(2, 0, 1, 3) == "cell2-e3" and replica_name(2, 0, 1, 1, 2) == "cell2-e1w2"
    names = [replica_name(c, r, 3, s, w) for c, r, s, w in itertools.product(range(3), range(3), (1, 2), (0, 1))]
    assert len(set(names)) == len(names) and replica_name(1, 2, 3, 1) == "cell1-r2-e1"


def test_fixed_port_indices_never_collide_across_cells_and_replicas():
    idx = [port_index(c, r, 4) for c in range(5) for r in range(4)]
    assert sorted(idx) == list(range(20))
    with pytest.raises(ValueError):
        port_index(0, 4, 4)


def test_sglang_runs_tp_size_and_binds_each_cpu_rank_to_its_own_cores():
    from gyre_hpc.engines.launch import device_env, omp_bind, sglang_command, sglang_env

    one = sglang_command(EngineConfig(kind="sglang", model_path="/m"), 30001, "cpu")
    assert "--tp-size" not in one  # tp 1: the command as before
    two = sglang_command(EngineConfig(kind="sglang", model_path="/m", tp=2), 30001, "cpu")
    assert two[two.index("--tp-size") + 1] == "2"
    assert omp_bind([0, 1], 2) == "0|1" and omp_bind(range(5), 2) == "0-2|3-4" and omp_bind([0, 2, 3, 8], 2) == "0,2|3,8"
    with pytest.raises(EngineError, match="engine.tp=4"):
        omp_bind([0, 1], 4)
    assert sglang_env("cpu", 2, cores=[0, 1, 2, 3]) == {"SGLANG_USE_CPU_ENGINE": "1",
                                                         "SGLANG_CPU_OMP_THREADS_BIND": "0-1|2-3"}
    assert sglang_env("cpu") == {"SGLANG_USE_CPU_ENGINE": "1"} and sglang_env("cuda", 2) == {}
    assert device_env("2,3") == {"CUDA_VISIBLE_DEVICES": "2,3"} and device_env(None) == {}


def test_the_router_balances_over_every_replica_of_every_cell_and_a_cell_drain_takes_all_of_its_replicas():
    from gyre_hpc.proxy.routing import Router

    router = Router()
    for cell, replica in itertools.product(range(2), range(2)):
        name = replica_name(cell, replica, 2, 1)
        router.add(name, f"http://h:{port_index(cell, replica, 2) + 30000}", cell)
    for i in range(8):  # a replica is an engine to the balance rule: least loaded, ties to the first added
        router.start(f"k{i}", f"run{i}")
    assert [e.load for e in router.engines()] == [2, 2, 2, 2]
    assert router.cell_engines(0) == ["cell0-r0-e1", "cell0-r1-e1"]
    keys = router.drain(router.cell_engines(0))  # what the proxy's drain(cell=0) does
    assert keys == sorted(k for e in router.engines()[:2] for k in e.in_flight) and len(keys) == 4
    assert [e.name for e in router.active()] == ["cell1-r0-e1", "cell1-r1-e1"]
    for i in range(8, 12):  # new runs go to the other cell's replicas only, spread over both
        router.start(f"k{i}", f"run{i}")
    assert [e.load for e in router.active()] == [4, 4]
