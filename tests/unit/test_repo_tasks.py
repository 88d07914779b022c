"""The task loader: strict errors naming task and file; fresh workspaces hold the repository and nothing hidden."""
import shutil
from pathlib import Path

import pytest

from gyre_hpc.agents.repo_tasks import HIDDEN_TESTS, PATCH_FILE, load_task, load_tasks, make_workspace
from gyre_hpc.errors import TaskError

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def copy_task(tmp_path, name="t05_version_compare"):
    dest = tmp_path / "tasks" / name
    shutil.copytree(TASKS / name, dest)
    return dest


def test_shipped_tasks_load_sorted_with_statements():
    tasks = load_tasks(TASKS)
    assert len(tasks) >= 20
    assert [t.name for t in tasks] == sorted(t.name for t in tasks)
    assert all(t.statement and t.title and t.patch.is_file() and t.hidden_tests.is_file() for t in tasks)
    assert len({t.repo.resolve() for t in tasks}) == len(tasks)


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "task.yaml").unlink(), r"task t05_version_compare: .*task\.yaml is missing"),
    (lambda d: (d / "task.yaml").write_text("title: x\nstatement: y\nhint: z\n"),
     r"task t05_version_compare: .*task\.yaml: unknown key 'hint'; valid keys: title, statement"),
    (lambda d: (d / "task.yaml").write_text("title: x\nstatement: ''\n"),
     r"task\.yaml: statement must be a non-empty string"),
    (lambda d: (d / "task.yaml").write_text("title: [x\n"), r"task\.yaml: invalid YAML"),
    (lambda d: (d / HIDDEN_TESTS).unlink(), r"task t05_version_compare: .*hidden_tests\.py is missing or empty"),
    (lambda d: (d / PATCH_FILE).write_text(""), r"fix\.patch is missing or empty"),
    (lambda d: shutil.rmtree(d / "repo"), r"repo is missing or empty"),
    (lambda d: shutil.copy(d / HIDDEN_TESTS, d / "repo" / HIDDEN_TESTS), r"repo contains a hidden_tests\.py"),
])
def test_malformed_task_names_the_task_and_the_file(tmp_path, breakage, message):
    task_dir = copy_task(tmp_path)
    breakage(task_dir)
    with pytest.raises(TaskError, match=message):
        load_tasks(task_dir.parent)


def test_empty_or_missing_tasks_directory_is_an_error(tmp_path):
    with pytest.raises(TaskError, match="holds no task directories"):
        load_tasks(tmp_path)
    with pytest.raises(TaskError, match="tasks directory not found"):
        load_tasks(tmp_path / "nope")


def test_workspace_is_a_fresh_copy_of_the_repo_without_hidden_tests_or_patch(tmp_path):
    task = load_task(TASKS / "t05_version_compare")
    first, second = make_workspace(task, tmp_path), make_workspace(task, tmp_path)
    assert first != second
    files = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(task.repo)) for p in task.repo.rglob("*") if p.is_file()
                           and "__pycache__" not in p.parts)
    names = {p.name for p in first.rglob("*")}
    assert HIDDEN_TESTS not in names and PATCH_FILE not in names and "test_hidden.py" not in names
    assert task.hidden_tests.read_text() not in "".join(p.read_text() for p in first.rglob("*.py"))
    (first / "semver_lite" / "versions.py").write_text("broken")
    original = (task.repo / "semver_lite" / "versions.py").read_text()
    assert (second / "semver_lite" / "versions.py").read_text() == original
