"""The local SLURM cluster for integration tests: a session fixture that uses it when it is up and starts it with
scripts/local-slurm.sh when it is not (and then stops it again); it FAILS, never skips, when it cannot start.

Also small helpers: ``sbatch`` (submit a bash script, wait, return its output), ``job``/``ended``/``wait_until``
(poll a job; a timeout fails with what the caller explains), ``start_requeued`` (lift SLURM's hold on a requeued
job, and its launch-failure hold), and functions that submitit jobs run (importable in the job because the
fixture puts this directory on PYTHONPATH).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gyre_hpc import clock

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm.sh"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Cluster:
    dir: Path
    conf: Path
    started_here: bool


def script(command: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture(scope="session")
def local_slurm():
    started = False
    if script("status").returncode != 0:
        out = script("start")
        if out.returncode != 0:
            pytest.fail(f"the local SLURM cluster could not start (scripts/local-slurm.sh start, exit "
                        f"{out.returncode}):\n{out.stdout}{out.stderr}", pytrace=False)
        # a status check can fail on a loaded machine while the cluster is up: start then says so, and this
        # session must not stop a cluster that other sessions are using
        started = "already running" not in out.stdout
    exports = dict(re.findall(r"export (\w+)=(\S+)", script("env").stdout))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", exports["SLURM_CONF"])
        mp.setenv("PATH", f"{exports['PATH'].split(':')[0]}:{os.environ['PATH']}")
        mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]))
        yield Cluster(Path(exports["SLURM_CONF"]).parents[1], Path(exports["SLURM_CONF"]), started)
    if started:
        script("stop")


@pytest.fixture(scope="session")
def mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.fail("mpirun not found: install Open MPI with scripts/local-slurm.sh install "
                    "(apt-get install --no-install-recommends openmpi-bin)", pytrace=False)
    return path


def mpirun_env(**extra: str) -> dict[str, str]:
    """The environment for ``mpirun`` started by a test outside SLURM: no SLURM/PMIx/Open MPI world variables of
    an enclosing job, root allowed, the repository on PYTHONPATH, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **extra)
    return env


@dataclass(frozen=True)
class JobRun:
    returncode: int
    output: str
    job_id: int

    def lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.strip()]


FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


def wait_for(job_id: str, timeout: float = 60) -> tuple[str, int]:
    """Poll ``scontrol show job`` every 0.05 s (``sbatch --wait`` polls every 2-10 s) until the job has
    ended; return (state, exit code). On timeout, cancel the job and fail."""
    def final_record() -> str:
        record = job(job_id)
        return record if ended_in(record) else ""

    record = clock.wait_until(final_record, timeout, poll_s=0.05)
    if not record:
        subprocess.run(["scancel", job_id])
        raise AssertionError(f"job {job_id} did not end within {timeout} s ({job(job_id)})")
    state = re.search(r"JobState=(\S+)", record).group(1)
    return state, int(re.search(r" ExitCode=(\d+):", record).group(1))


def job(job_id: str) -> str:
    """The job's one-line ``scontrol show job`` record ("" once SLURM has forgotten it)."""
    return subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout


def ended_in(record: str) -> bool:
    """Whether a ``job`` record shows an end state."""
    state = re.search(r"JobState=(\S+)", record)
    return bool(state) and state.group(1) in FINAL_STATES


def ended(job_id: str) -> bool:
    return ended_in(job(job_id))


def wait_until(cond, what: str, timeout: float, explain=lambda: "") -> None:
    """gyre_hpc.clock.wait_until polling every 0.2 s; on timeout fail with ``what`` and ``explain()`` (the job's
    record, log tails)."""
    if not clock.wait_until(cond, timeout, poll_s=0.2):
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{explain()}")


#: a requeued job that SLURM holds after a failed launch: Priority=0, Reason=launch_failed_requeued_held or
#: JobHeldAdmin/JobHeldUser
HELD = re.compile(r"Priority=0 |Reason=\S*[Hh]eld")


def start_requeued(job_id: str, *updates: str, timeout: float = 300) -> None:
    """Start a requeued, PENDING job now, as an administrator would, applying ``updates`` (e.g.
    ``TimeLimit=30``). SLURM holds a requeued job for about two minutes (Reason=BeginTime), lifted by
    ``scontrol update JobId=J StartTime=now``. A start within a few seconds of the requeue can fail ("Job
    credential revoked", more often on a loaded machine), and SLURM then holds the job (Priority=0) until
    ``scontrol release``; both are lifted here, repeatedly, until the job runs or has ended."""
    time.sleep(3)  # the requeue's own clean-up first: a start in its second fails with a revoked credential
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now", *updates], check=True)

    def lifted() -> bool:
        record = job(job_id)
        if "JobState=PENDING" not in record:
            return True
        if HELD.search(record):
            subprocess.run(["scontrol", "release", job_id], capture_output=True)
        elif "Reason=BeginTime" in record:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
        return False

    if not clock.wait_until(lifted, timeout, poll_s=2):
        raise AssertionError(f"the requeued job {job_id} did not start within {timeout} s:\n{job(job_id)}")


def sbatch(tmp_path: Path, body: str, *args: str, timeout: float = 60) -> JobRun:
    """Submit ``body`` as a bash batch script with ``args``, wait for it, and return its output."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body + "\n")
    out = tmp_path / "job.out"
    sub = subprocess.run(["sbatch", "--parsable", "-o", str(out), "-D", str(tmp_path), *args, str(path)],
                         capture_output=True, text=True, timeout=30)
    assert sub.returncode == 0, f"sbatch failed: {sub.stderr}"
    job_id = sub.stdout.split(";")[0].strip()
    _, code = wait_for(job_id, timeout)
    return JobRun(code, out.read_text() if out.exists() else "", int(job_id))


# ---------------------------------------------------------------------------- functions submitit jobs run
def rank_and_node() -> tuple[int, int, str]:
    """(global rank, world size, emulated node) of a submitit task."""
    import submitit

    env = submitit.JobEnvironment()
    return env.global_rank, env.num_tasks, os.environ["SLURMD_NODENAME"]


def hard_exit(code: int) -> None:
    """Die without a Python exception, so that submitit writes no result file."""
    sys.stdout.flush()
    os._exit(code)
