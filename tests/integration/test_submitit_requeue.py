"""Preemption of a job submitted from Python (``gyre_hpc.submit``, submitit on the real local SLURM cluster, 1 + 2
ranks over pmix on 2 emulated nodes): ``scancel --signal=USR1 JOBID`` reaches every rank of the step; the ranks
save RUN_DIR/resume and exit 75; rank 0's ``TrainRank`` (a submitit ``Checkpointable``) stores its
``checkpoint()`` resubmission and requeues the job; the same job id runs again on the same RUN_DIR, resumes and
finishes, and ``run.result()`` is the summary of both segments.

The same for a job that reaches its time limit: nobody signals it; SLURM sends submitit's time-limit signal
(``#SBATCH --signal=USR2@N``) to every task N seconds before the limit, which is a preemption on submitit's tasks
(gyre_hpc.lifecycle.rank_signals): the ranks save and exit 75, rank 0 requeues the job, spending one of submitit's timeouts;
the test follows the resumed segment to its first step, then cancels the job with ``scancel``, which is not
requeued (a SIGTERM to a job no longer RUNNING; the USR1 test runs its resume to the end).

SLURM holds a requeued job for about two minutes (its BeginTime); the test lifts the hold with
``scontrol update JobId=J StartTime=now`` as an administrator would, and the hold after a failed launch with
``scontrol release`` (slurm_cluster.start_requeued, as test_slurm_preempt.py does). A wait that times out fails
with the job's record and the tails of rank 0's submitit logs."""
import json
import subprocess

import pytest

import gyre_hpc
from gyre_hpc.allocator.eventlog import read_events
from gyre_hpc.slurm.submit_requeue import TrainRank
from slurm_cluster import ROOT, ended, job, local_slurm, start_requeued, wait_until  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.megatron, pytest.mark.mooncake, pytest.mark.slow,
              pytest.mark.timeout(2400)]

STEPS = 3
LIVE = {"cluster.cells": 2, "allocator.steps": STEPS, "scheduler.policy": "async", "scheduler.async_train_cells": 1,
        "scheduler.batch_groups": 2, "agent.runs_per_group": 2, "agent.turns": [1, 2], "agent.timeout_s": 120,
        "allocator.hello_timeout_s": 600, "allocator.heartbeat_timeout_s": 300, "proxy.startup_timeout_s": 180,
        "engine.startup_timeout_s": 600, "agent.tool_time_median_s": 1.0,
        "engine.kv_cache": False, "engine.sleep_in_training": False}  # as written (configs: both on, issue 31)
TIMEOUT_S = 900


def explain(run) -> str:
    """The job's record and the tails of rank 0's submitit logs, for a wait that timed out."""
    tails = [f"--- {path.name}\n{path.read_text()[-3000:]}" for path in
             sorted((run.run_dir / "submitit").glob(f"{run.job_id}_0_log.*"))]
    return "\n".join([job(run.job_id), *tails])


def wait(run, cond, what: str, timeout: float = TIMEOUT_S) -> None:
    wait_until(cond, what, timeout, lambda: explain(run))


def started(run) -> bool:
    path = run.run_dir / "events.jsonl"
    return path.is_file() and any(e["event"] == "started" for e in read_events(path))


def stepped_after_resume(run) -> bool:
    path = run.run_dir / "events.jsonl"
    kinds = [e["event"] for e in read_events(path)] if path.is_file() else []
    return "resumed" in kinds and "step" in kinds[kinds.index("resumed"):]


def test_checkpoint_resubmits_the_same_rank_function_on_the_same_run_dir():
    task = TrainRank()
    again = task.checkpoint("config.yaml", "/runs/r")
    assert again.function is task and again.args == ("config.yaml", "/runs/r") and again.kwargs == {}


def test_a_preempted_submitit_job_is_requeued_and_resumes_to_the_end(local_slurm, tmp_path):
    run = gyre_hpc.submit(str(ROOT / "configs" / "local_4node.yaml"), LIVE, executor="slurm",
                          **{"run.out_dir": str(tmp_path / "runs"), "run.name": "requeue"})
    # as soon as every rank is up (the steps of this small async job follow each other within a second)
    wait(run, lambda: started(run) or ended(run.job_id), "the ranks to start")
    assert "JobState=RUNNING" in job(run.job_id), job(run.job_id)
    subprocess.run(["scancel", "--signal=USR1", run.job_id], check=True)  # every task of the step
    wait(run, lambda: "Restarts=1" in job(run.job_id) or ended(run.job_id), "the requeue")
    assert "Restarts=1" in job(run.job_id), job(run.job_id)
    wait(run, lambda: "JobState=PENDING" in job(run.job_id) or ended(run.job_id), "the requeued job to pend", 120)
    start_requeued(run.job_id)
    summary = run.result(timeout_s=TIMEOUT_S)
    assert summary["steps"] == STEPS and summary["segments"] == 2
    events = read_events(run.run_dir / "events.jsonl")
    (pre,) = [e for e in events if e["event"] == "preempted"]
    (res,) = [e for e in events if e["event"] == "resumed"]
    assert pre["signal"] == "SIGUSR1" and 0 <= pre["steps_done"] < STEPS
    assert res["steps_done"] == pre["steps_done"] and res["version"] == pre["version"]
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))


#: 5 minutes with submitit's signal 120 s before the limit: SLURM sends USR2 between 120 and 180 s after the start
#: (up to 60 s early: sbatch(1), --signal). Ranks start in 25-130 s here; one step takes ~10 s or more (two groups
#: at a time, max_window_batches=1, each of two ~5 s tool calls a run), so 20 steps are still running then.
TL_STEPS = 20
TIME_LIMITED = {**LIVE, "allocator.steps": TL_STEPS, "slurm.time": "00:05:00", "slurm.signal": "USR2@120",
                "scheduler.max_window_batches": 1, "agent.turns": [2, 2], "agent.tool_time_median_s": 5.0,
                "agent.tool_time_sigma": 0.2}


@pytest.mark.waits  # ~2 of its ~3.5 minutes wait for SLURM's time limit: started first (tests/conftest.py)
def test_a_submitit_job_that_reaches_its_time_limit_is_requeued_and_its_resumed_segment_trains_on(local_slurm, tmp_path):
    run = gyre_hpc.submit(str(ROOT / "configs" / "local_4node.yaml"), TIME_LIMITED, executor="slurm",
                          **{"run.out_dir": str(tmp_path / "runs"), "run.name": "timelimit"})
    script = (run.run_dir / "submitit" / f"{run.job_id}_submission.sh").read_text()
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --time=5" in script
    # nothing is sent to the job: SLURM's time-limit signal comes, the ranks save, rank 0 requeues
    wait(run, lambda: "Restarts=1" in job(run.job_id) or ended(run.job_id), "the time-limit requeue")
    assert "Restarts=1" in job(run.job_id), job(run.job_id)
    wait(run, lambda: "JobState=PENDING" in job(run.job_id) or ended(run.job_id), "the requeued job to pend", 120)
    # the hold lifted, and the limit too: a second segment that reached it again would be requeued again (up to
    # submitit's max_num_timeout times), but this test follows one time-limit requeue into the resumed segment
    start_requeued(run.job_id, "TimeLimit=30")
    # one step trained after the resume shows that it resumed and trains on (the USR1 test above, and the
    # gyre-train preemption tests, run resumed segments to the end): then the job is cancelled, ~2 min sooner
    wait(run, lambda: stepped_after_resume(run) or ended(run.job_id), "a step of the resumed segment")
    subprocess.run(["scancel", run.job_id], check=True)  # a cancel, not a preemption: not requeued again
    wait(run, lambda: ended(run.job_id), "the cancelled job to end", 120)
    assert "JobState=CANCELLED" in job(run.job_id) and "Restarts=1" in job(run.job_id), job(run.job_id)
    events = read_events(run.run_dir / "events.jsonl")
    pre, cancel = [e for e in events if e["event"] == "preempted"]  # the time limit's, then the scancel's
    assert cancel["signal"] == "SIGTERM" and cancel["steps_done"] > pre["steps_done"]
    (res,) = [e for e in events if e["event"] == "resumed"]
    assert pre["signal"] == "SIGUSR2" and 0 <= pre["steps_done"] < TL_STEPS
    assert res["steps_done"] == pre["steps_done"] and res["version"] == pre["version"]
    steps = [json.loads(line)["step"] for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > pre["steps_done"]  # numbered on, no gap
    rank0 = (run.run_dir / "submitit" / f"{run.job_id}_0_log.out").read_text()  # submitit's log
    assert f"Requeued job {run.job_id} (2 remaining timeouts)" in rank0  # the time limit spent one of 3
