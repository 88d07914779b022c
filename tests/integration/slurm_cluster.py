"""The local SLURM cluster for integration tests: a session fixture that uses it when it is up and starts it with
scripts/local-slurm.sh when it is not (and then stops it again); it FAILS, never skips, when it cannot start.

Also small helpers: ``sbatch`` (submit a bash script, wait, return its output) and functions that submitit
jobs run (importable in the job because the fixture puts this directory on PYTHONPATH).
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
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
        state = re.search(r"JobState=(\S+)", out)
        if state and state.group(1) in FINAL_STATES:
            return state.group(1), int(re.search(r" ExitCode=(\d+):", out).group(1))
        time.sleep(0.05)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"job {job_id} did not end within {timeout} s ({state.group(1) if state else out})")


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
