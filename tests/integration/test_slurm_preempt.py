"""Preemption on the local SLURM cluster with the checked-in sbatch/local_4node.sh (1 + 4 ranks over pmix):

- ``scancel --signal=USR1 --batch JOBID`` (what ``#SBATCH --signal=B:USR1@60`` does before the time limit): the
  batch shell forwards USR1 to the step, the ranks save RUN_DIR/resume and exit 75, the script requeues its own
  job; the same job id runs again on the same RUN_DIR, resumes and finishes.
- plain ``scancel JOBID``: a cancel. The ranks still save their resume state on SLURM's SIGTERM (within KillWait),
  the job ends CANCELLED and is not requeued; ``gyre train CONFIG --resume RUN_DIR`` can continue it by hand.

SLURM holds a requeued job for about two minutes (its BeginTime); the test lifts the hold with
``scontrol update JobId=J StartTime=now`` as an administrator would.
"""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gyre_hpc import resume
from gyre_hpc.allocator.eventlog import read_events
from slurm_cluster import ROOT, local_slurm, wait_for  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.megatron, pytest.mark.slow]

STEPS = 3
ARGS = ["--set", f"allocator.steps={STEPS}", "--set", "scheduler.policy=async", "--set",
        "scheduler.async_train_cells=1", "--set", "scheduler.batch_groups=2", "--set", "agent.runs_per_group=2",
        "--set", "agent.turns=[1, 2]", "--set", "allocator.hello_timeout_s=300", "--set",
        "allocator.heartbeat_timeout_s=300", "--set", "proxy.startup_timeout_s=180"]
TIMEOUT_S = 900


def submit(tmp_path: Path) -> tuple[str, Path, Path]:
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    env = {**os.environ, "GYRE_RUN_DIR": str(run_dir)}
    sub = subprocess.run(["sbatch", "--parsable", "-o", str(out), "-e", str(out), "sbatch/local_4node.sh", *ARGS],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=30)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.split(";")[0].strip(), run_dir, out


def job(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout


def wait_until(cond, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def ended(job_id: str) -> bool:
    return bool(re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED)", job(job_id)))


def first_step(job_id: str, run_dir: Path, out: Path) -> None:
    wait_until(lambda: steps_done(run_dir) >= 1 or ended(job_id), "the first step")
    assert "JobState=RUNNING" in job(job_id), (job(job_id), out.read_text()[-3000:] if out.exists() else "")


def test_usr1_to_the_batch_shell_preempts_requeues_and_the_same_job_resumes_to_the_end(local_slurm, tmp_path):
    job_id, run_dir, out = submit(tmp_path)
    first_step(job_id, run_dir, out)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    wait_until(lambda: "Restarts=1" in job(job_id) and "JobState=PENDING" in job(job_id), "the requeue")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    state, code = wait_for(job_id, TIMEOUT_S)
    log = out.read_text()
    assert (state, code) == ("COMPLETED", 0), log[-4000:]
    assert f"job {job_id} requeued (restart 1 of 3)" in log
    events = read_events(run_dir / "events.jsonl")
    (pre,) = [e for e in events if e["event"] == "preempted"]
    (res,) = [e for e in events if e["event"] == "resumed"]
    assert pre["signal"] == "SIGUSR1"
    keys = ("version", "steps_done", "trained_batches", "lag_sum", "window", "buffer", "next_gid")
    assert {k: res[k] for k in keys} == {k: pre[k] for k in keys}
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["segments"] == 2


def test_plain_scancel_cancels_without_requeue_and_leaves_a_resumable_state(local_slurm, tmp_path):
    job_id, run_dir, out = submit(tmp_path)
    first_step(job_id, run_dir, out)
    subprocess.run(["scancel", job_id], check=True)
    state, _ = wait_for(job_id, 60)
    assert state == "CANCELLED" and "Restarts=0" in job(job_id)
    saved = resume.load(run_dir)  # written on SLURM's SIGTERM before KillWait ran out
    assert saved["sched"]["steps_done"] >= 1
    assert saved["version"] == json.loads((run_dir / "checkpoints" / "latest" / "meta.json").read_text())["version"]
    assert re.search(r'"event": "preempted".*"signal": "SIGTERM"', (run_dir / "events.jsonl").read_text())
