"""Repository-repair tasks: load a tasks directory with strict errors, and lay out a fresh workspace per run.

A task is a directory (the format is in docs/agents.md)::

    tasks/<name>/
        task.yaml          title: one line;  statement: the issue text the agent gets
        repo/              the buggy repository: what the agent's workspace starts as
        hidden_tests.py    pytest tests the agent never sees (not named test_*, so no suite collects it)
        fix.patch          the reference patch, a unified diff applied inside the workspace with ``patch -p1``

Invariants
- ``load_tasks`` either returns every task of the directory, sorted by name, or raises ``TaskError`` naming the
  task and the file at fault; it never returns a partial list.
- A workspace made by ``make_workspace`` is a fresh copy of ``repo/`` only: it never contains the hidden tests
  or the reference patch, and two workspaces never share a directory.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from gyre_hpc.errors import TaskError

TASK_FILE, REPO_DIR, HIDDEN_TESTS, PATCH_FILE = "task.yaml", "repo", "hidden_tests.py", "fix.patch"
TASK_KEYS = {"title": "one line naming the bug", "statement": "the issue text the agent receives"}


@dataclass(frozen=True)
class RepoTask:
    """One repository-repair task; paths are absolute."""

    name: str
    title: str
    statement: str
    root: Path

    @property
    def repo(self) -> Path:
        return self.root / REPO_DIR

    @property
    def hidden_tests(self) -> Path:
        return self.root / HIDDEN_TESTS

    @property
    def patch(self) -> Path:
        return self.root / PATCH_FILE


def load_task(root: str | Path) -> RepoTask:
    """Read one task directory; every problem is a ``TaskError`` naming the task and the file."""
    root = Path(root).resolve()
    name = root.name
    if not root.is_dir():
        raise TaskError(f"task {name}: {root} is not a directory")
    meta_path = root / TASK_FILE
    if not meta_path.is_file():
        raise TaskError(f"task {name}: {meta_path} is missing")
    try:
        meta = yaml.safe_load(meta_path.read_text())
    except yaml.YAMLError as exc:
        raise TaskError(f"task {name}: {meta_path}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(meta, dict):
        raise TaskError(f"task {name}: {meta_path}: expected a mapping with keys {', '.join(TASK_KEYS)}")
    unknown = sorted(set(meta) - set(TASK_KEYS))
    if unknown:
        raise TaskError(f"task {name}: {meta_path}: unknown key {unknown[0]!r}; valid keys: {', '.join(TASK_KEYS)}")
    for key in TASK_KEYS:
        value = meta.get(key)
        if not isinstance(value, str) or not value.strip():
            raise TaskError(f"task {name}: {meta_path}: {key} must be a non-empty string, got {value!r}")
    if not (root / REPO_DIR).is_dir() or not any((root / REPO_DIR).iterdir()):
        raise TaskError(f"task {name}: {root / REPO_DIR} is missing or empty")
    for file in (HIDDEN_TESTS, PATCH_FILE):
        path = root / file
        if not path.is_file() or not path.read_text().strip():
            raise TaskError(f"task {name}: {path} is missing or empty")
    if any(p.name == HIDDEN_TESTS for p in (root / REPO_DIR).rglob("*")):
        raise TaskError(f"task {name}: {root / REPO_DIR} contains a {HIDDEN_TESTS}; hidden tests live beside repo/")
    return RepoTask(name=name, title=meta["title"].strip(), statement=meta["statement"].strip(), root=root)


def load_tasks(directory: str | Path) -> tuple[RepoTask, ...]:
    """Every task under ``directory`` (each subdirectory is one), sorted by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TaskError(f"tasks directory not found: {directory}")
    roots = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not roots:
        raise TaskError(f"tasks directory {directory} holds no task directories")
    return tuple(load_task(r) for r in roots)


def make_workspace(task: RepoTask, parent: str | Path | None = None) -> Path:
    """A new directory holding a copy of the task's ``repo/`` and nothing else; the caller removes it."""
    workspace = Path(tempfile.mkdtemp(prefix=f"gyre-{task.name}-", dir=parent))
    shutil.copytree(task.repo, workspace, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    return workspace
