"""``gyre_hpc.submit`` from Python: a short live training (3 cells, 2 steps) on the real local SLURM cluster, as
one pmix MPI world of 1 + 3 submitit tasks, and with submitit's local executor (mpirun); the handle's states,
event tail, summary and cancel. Nothing is stubbed: real engines, megatron-core, Mooncake, Open MPI, SLURM."""
import json
import os
import time
import warnings

import pytest

import gyre_hpc
from slurm_cluster import ROOT, local_slurm, mpirun  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow]
LIVE = {"cluster.cells": 3, "scheduler.policy": "colocate", "scheduler.batch_groups": 2, "allocator.steps": 2,
        "agent.runs_per_group": 4, "agent.turns": [1, 2], "agent.timeout_s": 120, "allocator.hello_timeout_s": 300,
        "proxy.startup_timeout_s": 180,
        "engine.sleep_in_training": True,  # no engine restart per switch (CPU); restarts: test_live_training
        "engine.kv_cache": False}  # as written: configs/local_4node.yaml turned it on (issue 31)
TIMEOUT_S = 540
#: Open MPI's known MPI_Init crash under srun --mpi=pmix (docs/slurm-local.md): a start is retried once on it.
OMPI_INIT_CRASH = "Segmentation fault"


def follow(run):
    """Poll the handle until the job ends: the states it went through and a tail seen while it ran."""
    states, tail, deadline = [], "", time.time() + TIMEOUT_S
    while not run.done():
        if not states or states[-1] != run.state:
            states.append(run.state)
        if not tail and run.state == "RUNNING" and run.events(tail=1):
            tail = run.tail(3)
        if time.time() > deadline:
            run.cancel()
            pytest.fail(f"{run} did not end in {TIMEOUT_S} s; last events:\n{run.tail(10)}")
        time.sleep(1.0)
    return states, tail


def submit_live(tmp_path, executor):
    for attempt in range(2):
        run = gyre_hpc.submit(str(ROOT / "configs" / "local_4node.yaml"), LIVE, executor=executor,
                              **{"run.out_dir": str(tmp_path / f"runs{attempt}"), "run.name": "api"})
        states, tail = follow(run)
        errors = "".join(p.read_text() for p in (run.run_dir / "submitit").glob("*.err"))
        if executor == "slurm" and OMPI_INIT_CRASH in errors and not run.events():
            warnings.warn(f"{run}: Open MPI crashed in MPI_Init (known defect); submitted again")
            continue
        return run, states, tail
    return run, states, tail


@pytest.fixture(scope="module")
def slurm_run(local_slurm, tmp_path_factory):
    return submit_live(tmp_path_factory.mktemp("api-slurm"), "slurm")


def test_submit_on_slurm_returns_the_summary_of_the_live_run(slurm_run):
    run, states, _ = slurm_run
    summary = run.result()
    assert summary["policy"] == "colocate" and summary["steps"] == 2  # run quality: test_live_training.py
    assert summary["run_dir"] == str(run.run_dir)
    assert json.loads((run.run_dir / "summary.json").read_text()) == summary
    assert run.events(tail=1)[0]["event"] == "stop"


def test_each_submitit_task_is_one_rank_of_one_world_placed_by_the_layout(slurm_run):
    run, _, _ = slurm_run
    assert (run.run_dir / f"hostfile-{run.job_id}").read_text().split() == ["n1", "n1", "n2", "n3"]
    logs = {t: (run.run_dir / "submitit" / f"{run.job_id}_{t}_log.out").read_text() for t in range(4)}
    assert all(f"global_rank={t}(4)" in logs[t] for t in range(4))  # JobEnvironment: rank t of 4 tasks
    hellos = sorted(e["cell"] for e in run.events() if e["event"] == "hello")
    assert hellos == [0, 1, 2]  # the allocator (rank 0) heard every cell rank over MPI


def test_the_handle_reports_slurm_states_and_tails_the_event_log(slurm_run):
    run, states, tail = slurm_run
    assert states[-1] == "RUNNING" and set(states) <= {"PENDING", "RUNNING"}
    seen = [line.split()[1] for line in tail.splitlines()]  # "<t>s <event> key=value ..."
    final = [e["event"] for e in run.events()]
    assert 1 <= len(seen) <= 3 and any(final[i:i + len(seen)] == seen for i in range(len(final)))
    deadline = time.time() + 90
    while run.state != "COMPLETED" and time.time() < deadline:  # sacct sees the end a little after the result
        time.sleep(1.0)
    assert run.state == "COMPLETED"


def test_submit_with_the_local_executor_returns_the_summary_of_the_live_run(mpirun, tmp_path, monkeypatch):
    """No SLURM: submitit's local executor runs gyre train's launcher (mpirun 1 + 3 ranks) and the handle returns
    the run's summary, as on SLURM."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run, states, _ = submit_live(tmp_path, "local")
    summary = run.result()
    assert summary["policy"] == "colocate" and summary["steps"] == 2 and summary["runs_lost"] == 0
    assert json.loads((run.run_dir / "summary.json").read_text()) == summary
    assert states[0] == "RUNNING" and run.state == "COMPLETED"


def test_submit_with_the_local_executor_runs_mpirun_and_cancel_stops_every_rank(mpirun, tmp_path, monkeypatch):
    """The local executor runs gyre train's launcher; cancelling once the run has started stops mpirun and its
    ranks in order (their stacks land in traces/), and the handle says CANCELLED."""
    import psutil

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = gyre_hpc.submit(str(ROOT / "configs" / "local.yaml"), LIVE, executor="local",
                          **{"run.out_dir": str(tmp_path), "run.name": "local"})
    assert run.executor == "local" and run.state == "RUNNING"
    deadline = time.time() + TIMEOUT_S
    while not any(e["event"] == "hello" for e in run.events()):
        assert not run.done() and time.time() < deadline, f"{run}: {run.job.stderr()}"
        time.sleep(1.0)
    ranks = [p for p in psutil.process_iter(["cmdline"]) if str(run.run_dir) in " ".join(p.info["cmdline"] or [])
             and "gyre_hpc.cli" in " ".join(p.info["cmdline"] or [])]
    assert len(ranks) >= 4  # mpirun + 1 + 3 ranks
    run.cancel()
    while not run.done():
        assert time.time() < deadline
        time.sleep(0.5)
    assert run.state == "CANCELLED"
    # SIGTERM preempts: the ranks stop in order (saving RUN_DIR/resume once the run has started) and no summary
    with pytest.raises(gyre_hpc.slurm.submit.JobError, match="without a summary"):
        run.result()
    psutil.wait_procs(ranks, timeout=30)
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert sorted(p.name for p in (run.run_dir / "traces").glob("rank*.txt")) == [f"rank{i}.txt" for i in range(4)]
