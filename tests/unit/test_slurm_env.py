"""SLURM environment parsing: one mapping table, host list expansion, and the consistency invariants."""
import dataclasses

import pytest

from gyre_hpc.errors import SlurmEnvError
from gyre_hpc.slurm.env import VARIABLES, SlurmEnv, expand_counts, expand_hostlist, from_environ, in_slurm

#: Rank 2 of ``srun -n 3 --distribution=arbitrary -w n1,n1,n3`` inside ``sbatch -N4 --ntasks-per-node=1``,
#: as printed on the local cluster (SLURM 22.05.8).
STEP_ENV = {
    "SLURM_JOB_ID": "13", "SLURM_JOBID": "13", "SLURM_JOB_NAME": "e_t5.sh", "SLURM_JOB_NODELIST": "n[1-4]",
    "SLURM_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_CPUS_PER_NODE": "1(x4)",
    "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NPROCS": "3", "SLURM_NTASKS": "3", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1,3]", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_TASKS_PER_NODE": "2,1",
    "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n3", "SLURM_SUBMIT_DIR": "/tmp",
}
#: The batch script of ``sbatch -N4 --ntasks-per-node=1`` (no step variables).
BATCH_ENV = {
    "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NNODES": "4", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "1(x4)", "SLURM_JOB_CPUS_PER_NODE": "1(x4)", "SLURMD_NODENAME": "n1",
}


def test_hostlist_expands_ranges_and_lists_keeping_zero_padding():
    assert expand_hostlist("n[1-3,7],gpu[01-02]") == ("n1", "n2", "n3", "n7", "gpu01", "gpu02")
    assert expand_hostlist("x[08-10]") == ("x08", "x09", "x10")
    assert expand_hostlist("login") == ("login",)


def test_hostlist_multiplies_several_bracket_groups():
    assert expand_hostlist("r[1-2]n[1-2]") == ("r1n1", "r1n2", "r2n1", "r2n2")


@pytest.mark.parametrize("text, why", [
    ("n[1-3", "unbalanced"), ("n1-3]", "unbalanced"), ("n[[1]]", "unbalanced"), ("n[3-1]", "backwards"),
    ("n[a-b]", "not a number"), ("n1,,n2", "empty name"), ("n[1-2],n2", "twice"),
])
def test_hostlist_rejects_malformed_text(text, why):
    with pytest.raises(ValueError, match=why):
        expand_hostlist(text)


def test_counts_expand_the_repeat_notation():
    assert expand_counts("2(x3),1") == (2, 2, 2, 1)
    assert expand_counts("4") == (4,)
    with pytest.raises(ValueError, match="not N or N"):
        expand_counts("2(3)")


def test_step_env_describes_the_step_and_keeps_the_job_nodes():
    env = from_environ(STEP_ENV)
    assert env.in_step and env.job_id == 13 and env.step_id == 0
    assert env.job_nodes == ("n1", "n2", "n3", "n4")
    assert env.nodes == env.step_nodes == ("n1", "n3")
    assert (env.proc_id, env.node_id, env.node_name, env.ntasks) == (2, 1, "n3", 3)
    assert env.tasks_per_node == (2, 1) and env.cpus_per_node == (1, 1, 1, 1)
    assert env.sources["ntasks"] == "SLURM_STEP_NUM_TASKS"


def test_batch_env_indexes_the_job_nodes():
    env = from_environ(BATCH_ENV)
    assert not env.in_step
    assert env.nodes == ("n1", "n2", "n3", "n4") and env.nodes[env.node_id] == env.node_name == "n1"
    assert env.tasks_per_node == (1, 1, 1, 1)


def test_first_set_variable_of_a_row_wins():
    env = from_environ({"SLURM_JOB_ID": "5", "SLURM_JOBID": "6"})
    assert env.job_id == 5 and env.sources["job_id"] == "SLURM_JOB_ID"
    assert from_environ({"SLURM_JOBID": "6"}).job_id == 6


def test_gpus_per_node_may_carry_a_type():
    env = from_environ({"SLURM_JOB_ID": "1", "SLURM_GPUS_PER_NODE": "a100:4", "SLURM_GPUS_ON_NODE": "4"})
    assert (env.gpus_per_node, env.gpus_on_node) == (4, 4)


def test_outside_slurm_is_detected_and_parsing_refuses():
    assert not in_slurm({"PATH": "/bin"}) and in_slurm(BATCH_ENV)
    with pytest.raises(SlurmEnvError, match="SLURM_JOB_ID is not set"):
        from_environ({"SLURM_PROCID": "0"})


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": "x"}, r"SLURM_PROCID='x' is malformed"),
    ({"SLURM_STEP_NODELIST": "n[1,3"}, r"SLURM_STEP_NODELIST='n\[1,3' is malformed: .*unbalanced"),
    ({"SLURMD_NODENAME": "n2"}, r"SLURM_NODEID=1 points at 'n3' in SLURM_STEP_NODELIST but SLURMD_NODENAME='n2'"),
    ({"SLURM_NODEID": "2"}, r"SLURM_NODEID=2 is outside the 2 nodes of SLURM_STEP_NODELIST"),
    ({"SLURM_PROCID": "3"}, r"SLURM_PROCID=3 is outside 0..SLURM_STEP_NUM_TASKS-1=2"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2,2"}, r"SLURM_STEP_TASKS_PER_NODE sums to 4 but SLURM_STEP_NUM_TASKS=3"),
    ({"SLURM_STEP_NUM_NODES": "3"}, r"SLURM_STEP_NODELIST names 2 nodes but SLURM_STEP_NUM_NODES=3"),
    ({"SLURM_JOB_NUM_NODES": "5"}, r"SLURM_JOB_NODELIST names 4 nodes but SLURM_JOB_NUM_NODES=5"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3", "SLURM_STEP_NUM_TASKS": "3"}, r"has 1 entries for 2 nodes"),
])
def test_inconsistent_environment_names_the_variable(change, message):
    with pytest.raises(SlurmEnvError, match=message):
        from_environ({**STEP_ENV, **change})


def test_every_field_has_exactly_one_table_row():
    fields = [f.name for f in dataclasses.fields(SlurmEnv) if f.name != "sources"]
    assert sorted(v.field for v in VARIABLES) == sorted(fields)
    names = [n for v in VARIABLES for n in v.names]
    assert len(names) == len(set(names))
