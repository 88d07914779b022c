"""The hidden-test grader (edge: subprocesses): the share of a task's hidden tests that pass in a run's workspace.

Grading copies the run's workspace to a fresh staging directory (the run's own workspace is never touched), puts
the hidden tests beside it (outside the copy), and runs pytest on them in a subprocess:

- a clean environment (PATH, HOME, LANG, TMPDIR only: none of the job's variables or secrets), ``python -I``
  (no PYTHONPATH, no user site), no conftest, no ini file of the workspace, no cache, no plugin autoload;
- rlimits (grader.cpu_s, grader.memory_mb, grader.file_mb, no core files), a wall-clock limit (grader.timeout_s;
  the process group is killed), and a per-test limit when pytest-timeout is installed (a hanging test fails);
- isolation when running as root with ``unshare``: a new network namespace (no network), a mount namespace in
  which everything outside the workspace copy and the report directory is read-only, and no capabilities
  (sandbox_launch.py; the process keeps uid 0, so it can read what root can read, but it can write nowhere
  else and reach nothing). Without root it runs unisolated and says so (``Grade.isolation == "none"``);
  ``grader.isolation: required`` refuses that.

Invariants
- The score is passed / collected hidden tests, in [0, 1]; a workspace whose code cannot even be imported
  collects one error and scores 0.0 (that is the agent's doing, and it trains).
- A grading that crashes, times out, collects nothing, or cannot establish a required sandbox is an
  ``eval_failure`` with a detail, never a score.
"""
from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gyre_hpc.agents.repo_tasks import RepoTask
from gyre_hpc.config import GraderConfig
from gyre_hpc.trajectory.records import RunStatus

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
SANDBOX_FAILED = 97  # sandbox_launch.SANDBOX_FAILED
TEST_FILE = "test_hidden.py"


@dataclass(frozen=True)
class Grade:
    """A grading's outcome: ``status`` SCORED with ``score`` in [0, 1], or EVAL_FAILURE with ``score`` None."""

    status: RunStatus
    score: float | None
    passed: int = 0
    total: int = 0
    detail: str = ""
    isolation: str = "none"

    @staticmethod
    def failure(detail: str, isolation: str = "none") -> "Grade":
        return Grade(RunStatus.EVAL_FAILURE, None, detail=detail, isolation=isolation)


@lru_cache(maxsize=1)
def sandbox_available() -> bool:
    """Root, ``unshare`` on PATH, and a mount + network namespace can actually be made here."""
    exe = shutil.which("unshare")
    if os.geteuid() != 0 or exe is None:
        return False
    probe = subprocess.run([exe, "--mount", "--net", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def grade_hidden_tests(task: RepoTask, workspace: str | Path, cfg: GraderConfig) -> Grade:
    """Run ``task``'s hidden tests against a copy of ``workspace``; see the module docstring."""
    isolate = cfg.isolation != "off" and sandbox_available()
    isolation = "netns+readonly-fs+nocaps" if isolate else "none"
    if cfg.isolation == "required" and not isolate:
        return Grade.failure("grader.isolation is required, but no sandbox can be made here (needs root and "
                             "unshare with mount and network namespaces)")
    if importlib.util.find_spec("pytest") is None:
        return Grade.failure("pytest is not installed here (pip install 'gyre_hpc[tasks]')")
    stage = Path(tempfile.mkdtemp(prefix=f"gyre-grade-{task.name}-"))
    try:
        ws, hidden, out = _stage(task, Path(workspace), stage)
        return _run(_argv(ws, hidden, out, cfg, isolate), ws, out, cfg, isolation)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _stage(task: RepoTask, workspace: Path, stage: Path) -> tuple[Path, Path, Path]:
    ws, hidden, out = stage / "ws", stage / "hidden", stage / "out"
    shutil.copytree(workspace, ws, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    hidden.mkdir()
    (out / "tmp").mkdir(parents=True)
    shutil.copyfile(task.hidden_tests, hidden / TEST_FILE)
    (hidden / "pytest.ini").write_text(f"[pytest]\npythonpath = {ws}\n")
    return ws, hidden, out


def _argv(ws: Path, hidden: Path, out: Path, cfg: GraderConfig, isolate: bool) -> list[str]:
    pytest = [sys.executable, "-I", "-B", "-m", "pytest", "-c", str(hidden / "pytest.ini"), "--rootdir", str(hidden),
              "-p", "no:cacheprovider", "--noconftest", "-q", "--junitxml", str(out / "report.xml"),
              "-o", "junit_family=xunit1", "--basetemp", str(out / "tmp" / "pytest")]
    if importlib.util.find_spec("pytest_timeout") is not None:
        per_test = max(1.0, cfg.timeout_s / 4)
        pytest += ["-p", "pytest_timeout", f"--timeout={per_test:g}"]
    pytest.append(str(hidden / TEST_FILE))
    if not isolate:
        return pytest
    unshare = shutil.which("unshare")
    return [unshare, "--mount", "--net", "--", sys.executable, "-I", str(LAUNCHER), str(ws), str(out), "--", *pytest]


def _run(argv: list[str], ws: Path, out: Path, cfg: GraderConfig, isolation: str) -> Grade:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(out), "LANG": "C.UTF-8", "TMPDIR": str(out / "tmp"),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    limits = {resource.RLIMIT_CPU: cfg.cpu_s, resource.RLIMIT_AS: cfg.memory_mb << 20,
              resource.RLIMIT_FSIZE: cfg.file_mb << 20, resource.RLIMIT_CORE: 0}

    def preexec() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))

    proc = subprocess.Popen(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=preexec, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Grade.failure(f"the hidden tests ran past grader.timeout_s={cfg.timeout_s:g}", isolation)
    tail = log.decode(errors="replace")[-600:].strip()
    if proc.returncode == SANDBOX_FAILED and isolation != "none":
        return Grade.failure(f"the sandbox could not be made: {tail}", isolation)
    if proc.returncode == 5:
        return Grade.failure(f"the hidden tests collected nothing: {tail}", isolation)
    if proc.returncode not in (0, 1, 2):  # 3 internal error, 4 usage, 5 nothing collected, <0 a signal
        return Grade.failure(f"pytest exited {proc.returncode}: {tail}", isolation)
    return _score(out / "report.xml", tail, isolation)


def _score(report: Path, tail: str, isolation: str) -> Grade:
    try:
        cases = ET.parse(report).getroot().iter("testcase")
    except (OSError, ET.ParseError) as exc:
        return Grade.failure(f"no readable test report ({exc}): {tail}", isolation)
    outcomes = [not any(child.tag in ("failure", "error", "skipped") for child in case) for case in cases]
    if not outcomes:
        return Grade.failure(f"the hidden tests collected nothing: {tail}", isolation)
    passed = sum(outcomes)
    return Grade(RunStatus.SCORED, passed / len(outcomes), passed, len(outcomes), tail.splitlines()[-1] if tail
                 else "", isolation)
