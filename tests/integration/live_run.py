"""Run ``gyre train configs/local.yaml --json`` the way a user does (it launches mpirun itself) for a test."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 480
# agent.timeout_s of the live tests: runs must not time out on a CI machine several times slower than a quiet one
# (the CI of 2026-12-05 ran the mpi group 5x slower than a quiet machine, timed out 13 of 40 runs at 120 s and
# failed runs_scored == runs_finished); a stop cancels the runs still going, so a longer timeout costs nothing
AGENT_TIMEOUT = "agent.timeout_s=600"


class RunWatcher(threading.Thread):
    """A thread that acts on a live run under ``out`` while it runs (kill, drain...), until ``timeout_s``; what it
    did or the error it met is for the test to check (``error``: empty when none). The default deadline is the
    run's own: a watcher that gives up before the run ends misses what it waits for on a slow machine."""

    def __init__(self, out: Path, timeout_s: float = TIMEOUT_S):
        super().__init__(daemon=True)
        self.out, self.deadline = out, time.monotonic() + timeout_s
        self.error = ""

    def _wait(self, probe, every_s: float = 0.1, retry_on: tuple = ()):
        """``probe()`` once it is not None (an exception in ``retry_on`` counts as None), polled every ``every_s``."""
        while time.monotonic() < self.deadline:
            try:
                got = probe()
            except retry_on:
                got = None
            if got is not None:
                return got
            time.sleep(every_s)
        raise TimeoutError(f"gave up waiting for {probe}")

    def _proxy_url(self) -> str | None:
        """The run's proxy URL, once its proxy.log says it is ready."""
        for log in self.out.glob("*/proxy.log"):
            m = re.search(r"gyre-proxy ready url=(\S+)", log.read_text(errors="replace"))
            if m:
                return m.group(1)
        return None


def launcher_env() -> dict[str, str]:
    """This process's environment for a ``gyre train`` launcher: without the MPI/SLURM variables that an earlier
    test's MPI initialisation (or an enclosing SLURM step) left here, which would make it a rank; this checkout
    first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PMIX", "OMPI_COMM", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_live(out: Path, overrides: list[str], returncode: int = 0, config: str = "local.yaml",
             timeout_s: float = TIMEOUT_S, path: list[str] = ()) -> tuple[dict, Path, str]:
    """(summary, run directory, stderr) of a live run of ``configs/<config>`` under ``out`` that exits with
    ``returncode``; on a timeout the test fails with the ranks' stacks. ``path``: more PYTHONPATH entries (a plugin)."""
    env = launcher_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *path])
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(ROOT / "configs" / config), "--json",
           "--set", f"run.out_dir={out}"] + [a for o in overrides for a in ("--set", o)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # gyre train dumps every rank's stacks to RUN_DIR/traces/ and ends mpirun's session
        stdout, stderr = proc.communicate(timeout=60)
        traces = "".join(p.read_text()[-3000:] for p in out.glob("*/traces/*.txt"))
        pytest.fail(f"the live run did not finish in {timeout_s} s; stacks of its ranks:\n{traces}\n{stderr[-3000:]}")
    assert proc.returncode == returncode, stderr[-4000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    return summary, Path(summary["run_dir"]), stderr
