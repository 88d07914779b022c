"""The hidden-test grader and ``gyre tasks check`` on real tasks, real pytest subprocesses and the real sandbox."""
import json
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from gyre_hpc.agents.grader import grade_hidden_tests, sandbox_available
from gyre_hpc.agents.repo_tasks import load_task, make_workspace
from gyre_hpc.config import GraderConfig
from gyre_hpc.trajectory.records import RunStatus

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"
needs_sandbox = pytest.mark.skipif(not sandbox_available(), reason="the sandbox needs root and unshare "
                                                                   "(mount + network namespaces)")


def gyre(*args):
    return subprocess.run([sys.executable, "-m", "gyre_hpc.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def make_task(tmp_path, source, tests, name="t_custom"):
    root = tmp_path / "tasks" / name
    (root / "repo" / "mod").mkdir(parents=True)
    (root / "repo" / "mod" / "__init__.py").write_text(textwrap.dedent(source))
    (root / "hidden_tests.py").write_text(textwrap.dedent(tests))
    (root / "fix.patch").write_text("not used here\n")
    (root / "task.yaml").write_text("title: custom\nstatement: a task built by the test\n")
    return load_task(root)


def grade(task, tmp_path, **cfg):
    return grade_hidden_tests(task, make_workspace(task, tmp_path), GraderConfig(**cfg))


@pytest.mark.slow
def test_every_shipped_task_checks_out():
    out = gyre("tasks", "check", str(TASKS), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ok"], report["failed"]
    assert len(report["tasks"]) >= 20
    assert all(t["unmodified"]["score"] == 0.0 and t["patched"]["score"] == 1.0 for t in report["tasks"])


def test_broken_or_ineffective_reference_patches_are_listed(tmp_path):
    for name in ("t12_duration", "t16_leap_year", "t20_percent"):
        shutil.copytree(TASKS / name, tmp_path / name)
    patch = tmp_path / "t12_duration" / "fix.patch"
    patch.write_text(patch.read_text().replace('"h": 360}', '"h": 361}'))  # context no longer matches
    leap = tmp_path / "t16_leap_year" / "fix.patch"
    leap.write_text(leap.read_text().replace("year % 400 == 0", "year % 40 == 0"))  # applies, fixes 2 of 3
    out = gyre("tasks", "check", str(tmp_path), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["failed"] == ["t12_duration", "t16_leap_year"]
    problems = {t["task"]: t["problem"] for t in report["tasks"]}
    assert "does not apply" in problems["t12_duration"]
    assert "reference patch scores 0.667 (2/3 hidden tests pass), expected 1.0" in problems["t16_leap_year"]
    text = gyre("tasks", "check", str(tmp_path))
    assert "FAIL t12_duration" in text.stdout and "ok   t20_percent" in text.stdout and text.returncode == 1


def test_partial_fix_gets_partial_credit(tmp_path):
    task = load_task(TASKS / "t14_env_flag")
    workspace = make_workspace(task, tmp_path)
    flags = workspace / "envcfg" / "flags.py"
    flags.write_text(flags.read_text().replace('return value.strip() != ""',
                                               'return value.strip().lower() not in ("", "0", "false", "off")'))
    result = grade_hidden_tests(task, workspace, GraderConfig())
    assert (result.status, result.passed, result.total) == (RunStatus.SCORED, 2, 3)
    assert result.score == pytest.approx(2 / 3)


def test_code_that_does_not_import_scores_zero_not_an_eval_failure(tmp_path):
    task = make_task(tmp_path, "def f(:\n", "from mod import f\n\ndef test_f():\n    assert f\n")
    result = grade(task, tmp_path)
    assert (result.status, result.score) == (RunStatus.SCORED, 0.0)


def test_crashing_or_hanging_grading_is_an_eval_failure(tmp_path):
    crash = make_task(tmp_path, "", "import os\nos._exit(3)\n", name="t_crash")
    result = grade(crash, tmp_path)
    assert (result.status, result.score) == (RunStatus.EVAL_FAILURE, None) and "exited 3" in result.detail
    hang = make_task(tmp_path, "", "import time\ntime.sleep(60)\n\ndef test_x():\n    pass\n", name="t_hang")
    result = grade(hang, tmp_path, timeout_s=2.0)
    assert (result.status, result.score) == (RunStatus.EVAL_FAILURE, None) and "ran past" in result.detail
    empty = make_task(tmp_path, "", "X = 1\n", name="t_empty")
    assert "collected nothing" in grade(empty, tmp_path).detail


def test_grading_environment_holds_none_of_the_jobs_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("GYRE_TEST_SECRET", "hunter2")
    task = make_task(tmp_path, "import os\nENV = dict(os.environ)\n",
                     "from mod import ENV\n\ndef test_no_secret():\n    assert 'GYRE_TEST_SECRET' not in ENV\n")
    assert grade(task, tmp_path).score == 1.0


ESCAPES = """\
    import socket
    from pathlib import Path


    def write_outside(path):
        Path(path).write_text("escaped")


    def connect(port):
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
"""


@needs_sandbox
def test_workspace_code_cannot_write_outside_or_open_a_socket(tmp_path):
    target = Path("/tmp") / f"gyre-escape-{uuid.uuid4().hex}"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    tests = f"""
        from mod import connect, write_outside


        def test_write_outside():
            write_outside({str(target)!r})


        def test_connect():
            assert connect({port})
    """
    task = make_task(tmp_path, ESCAPES, tests)
    try:
        sandboxed = grade(task, tmp_path, isolation="required")
        assert sandboxed.isolation != "none"
        assert (sandboxed.status, sandboxed.score) == (RunStatus.SCORED, 0.0)
        assert not target.exists()
        with pytest.raises(BlockingIOError):
            server.accept()
        unsandboxed = grade(task, tmp_path, isolation="off")  # the control: the same code escapes without it
        assert unsandboxed.score == 1.0 and target.read_text() == "escaped"
    finally:
        server.close()
        target.unlink(missing_ok=True)
