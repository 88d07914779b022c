"""gyre_hpc.slurm.jobspec and the pure helpers of gyre_hpc.submit: what a submitit job asks SLURM for, how
overrides are written, state words, the rank check, and bad input failing before anything is written."""
import pytest

from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError, LayoutError
from gyre_hpc.slurm import jobspec
from gyre_hpc.slurm.layout import local_nodes, plan
from gyre_hpc.slurm.sbatch import LOCAL_EXPORTS
from gyre_hpc.slurm.submit import normal_state, override_list, submit
from gyre_hpc.slurm.submit_tasks import check_world

LOCAL4 = "configs/local_4node.yaml"


def test_training_job_is_one_pmix_world_of_one_plus_k_tasks_placed_by_a_hostfile():
    cfg = load_config(LOCAL4, ["cluster.cells=3"])
    p = jobspec.train_parameters(cfg, "/runs/r1")
    control = plan(cfg.cluster, local_nodes(cfg.cluster)).control_srun_args()
    assert p["slurm_srun_args"] == [a for a in control if not a.startswith("--nodelist")]
    assert "--ntasks=4" in p["slurm_srun_args"] and "--mpi=pmix" in p["slurm_srun_args"]
    assert "--distribution=arbitrary" in p["slurm_srun_args"]
    assert (p["nodes"], p["tasks_per_node"], p["timeout_min"], p["name"]) == (3, 1, 15, "gyre_local")
    setup = "\n".join(p["slurm_setup"])
    assert all(f"export {e}" in setup for e in LOCAL_EXPORTS + ("OMP_NUM_THREADS=1",))
    assert 'for N in "${NODES[@]}"; do for ((w = 0; w < 1; w++)); do echo "$N"' in setup
    assert "> /runs/r1/hostfile-\"$SLURM_JOB_ID\"" in setup
    assert setup.splitlines()[-1] == 'export SLURM_HOSTFILE=/runs/r1/hostfile-"$SLURM_JOB_ID"'


def test_site_options_reach_the_executor():
    cfg = load_config(LOCAL4, ["slurm.partition=gpu", "slurm.account=proj", "slurm.mem=8G",
                               "slurm.extra=[--qos=high, --exclusive]", "slurm.time=01:30:30",
                               "slurm.local_cluster=false"])
    p = jobspec.train_parameters(cfg, "/r")
    assert (p["slurm_partition"], p["slurm_account"], p["slurm_mem"], p["timeout_min"]) == ("gpu", "proj", "8G", 91)
    assert p["slurm_additional_parameters"] == {"qos": "high", "exclusive": True}
    assert not any("OMPI_MCA_btl" in line for line in p["slurm_setup"])


def test_a_layout_that_does_not_fit_fails_before_any_parameter_exists():
    cfg = load_config(LOCAL4, ["cluster.gpus_per_node=4", "cluster.tensor_parallel=3"])
    with pytest.raises(LayoutError, match="cluster.tensor_parallel=3 does not divide"):
        jobspec.train_parameters(cfg, "/r")


def test_single_task_jobs_ask_for_one_node_and_one_task():
    p = jobspec.single_task_parameters(load_config(LOCAL4), timeout_min=7)
    assert (p["nodes"], p["tasks_per_node"], p["timeout_min"]) == (1, 1, 7)
    assert "slurm_srun_args" not in p


def test_overrides_come_as_dotted_keywords_double_underscores_a_dict_or_a_list():
    assert override_list(None, {"allocator.steps": 2, "trajectory__j_max": None}) == [
        "allocator.steps=2", "trajectory.j_max=null"]
    assert override_list({"agent.turns": (1, 2), "run.name": "a b"}, {}) == ['agent.turns=[1, 2]', 'run.name="a b"']
    assert override_list(["allocator.steps=3"], {"run.seed": 1}) == ["allocator.steps=3", "run.seed=1"]
    with pytest.raises(ConfigError, match="unknown keyword 'steps'; config overrides are dotted keys"):
        override_list(None, {"steps": 2})


def test_state_words_are_slurms_on_both_executors():
    assert normal_state("CANCELLED by 0", "slurm") == "CANCELLED"
    assert normal_state("", "slurm") == "UNKNOWN"
    assert normal_state("FINISHED", "local", True) == "COMPLETED"
    assert normal_state("FINISHED", "local", False) == "FAILED"
    assert normal_state("INTERRUPTED", "local") == "CANCELLED"
    assert normal_state("RUNNING", "local") == "RUNNING"


def test_a_rank_refuses_a_world_that_is_not_the_layouts():
    check_world(2, 4, 2, 4, world_size=4)
    with pytest.raises(LayoutError, match="4 tasks but the layout needs 5"):
        check_world(0, 4, 0, 4, world_size=5)
    with pytest.raises(LayoutError, match="submitit says rank 2 of 4 but MPI says rank 0 of 1"):
        check_world(2, 4, 0, 1, world_size=4)


@pytest.mark.parametrize("config, overrides, error", [
    ("configs/nope.yaml", {}, "config file not found: configs/nope.yaml"),
    (LOCAL4, {"allocator.stepz": 2}, "unknown key allocator.stepz; valid keys of allocator: steps"),
    (LOCAL4, {"allocator.steps": 0}, "allocator.steps: must be >= 1"),
    (LOCAL4, {"cluster.cells": 1}, "cluster.cells: gyre needs at least 2 cells"),
    (LOCAL4, {"cluster.gpus_per_node": 4, "cluster.tensor_parallel": 3}, "does not divide"),
])
def test_bad_input_fails_before_anything_is_written_or_submitted(config, overrides, error, tmp_path):
    with pytest.raises((ConfigError, LayoutError)) as info:
        submit(config, {**overrides, "run.out_dir": str(tmp_path / "runs")}, executor="local")
    assert error in str(info.value)
    assert not (tmp_path / "runs").exists()
