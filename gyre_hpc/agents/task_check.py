"""Verifying shipped tasks (edge: subprocesses): the unmodified repository scores 0.0, the reference patch 1.0.

``check_task`` grades two fresh workspaces of a task with the hidden-test grader (gyre_hpc.agents.grader): one as
shipped, one with ``fix.patch`` applied by ``patch -p1``. ``gyre tasks check DIR`` prints one row per task.

Invariants
- A task passes only when the unmodified workspace is SCORED 0.0 and the patched one SCORED 1.0; a patch that does
  not apply, or a grading that is an eval_failure, fails the task with the reason.
- Every workspace it makes is removed, whatever happens.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gyre_hpc.agents.grader import Grade, grade_hidden_tests
from gyre_hpc.agents.repo_tasks import RepoTask, make_workspace
from gyre_hpc.config import GraderConfig
from gyre_hpc.errors import TaskError
from gyre_hpc.trajectory.records import RunStatus


@dataclass(frozen=True)
class TaskCheck:
    """The outcome of checking one task; ``problem`` is empty when it passes."""

    name: str
    unmodified: Grade | None
    patched: Grade | None
    problem: str

    @property
    def ok(self) -> bool:
        return not self.problem

    def to_json(self) -> dict:
        def grade(g: Grade | None) -> dict | None:
            return None if g is None else {"status": g.status.value, "score": g.score, "passed": g.passed,
                                           "total": g.total, "detail": g.detail}

        return {"task": self.name, "ok": self.ok, "problem": self.problem, "unmodified": grade(self.unmodified),
                "patched": grade(self.patched), "isolation": (self.patched or self.unmodified or Grade.failure(""))
                .isolation}


def apply_patch(workspace: Path, patch: Path) -> None:
    """Apply unified diff ``patch`` inside ``workspace`` (``patch -p1``); a failure is a ``TaskError``."""
    exe = shutil.which("patch")
    if exe is None:
        raise TaskError("the `patch` program is not installed (apt-get install patch)")
    out = subprocess.run([exe, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-i", str(patch)],
                         cwd=workspace, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise TaskError(f"{patch} does not apply: {(out.stdout + out.stderr).strip()[-400:]}")


def _graded(task: RepoTask, cfg: GraderConfig, patched: bool) -> Grade:
    workspace = make_workspace(task)
    try:
        if patched:
            apply_patch(workspace, task.patch)
        return grade_hidden_tests(task, workspace, cfg)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _problem(label: str, grade: Grade, want: float) -> str:
    if grade.status is not RunStatus.SCORED:
        return f"{label}: eval_failure ({grade.detail})"
    if grade.score != want:
        return f"{label} scores {grade.score:.3f} ({grade.passed}/{grade.total} hidden tests pass), expected {want}"
    return ""


def check_task(task: RepoTask, cfg: GraderConfig) -> TaskCheck:
    """Grade ``task`` unmodified and with its reference patch."""
    unmodified = _graded(task, cfg, patched=False)
    try:
        patched = _graded(task, cfg, patched=True)
    except TaskError as exc:
        return TaskCheck(task.name, unmodified, None, f"reference patch: {exc}")
    problems = [p for p in (_problem("unmodified", unmodified, 0.0), _problem("reference patch", patched, 1.0)) if p]
    return TaskCheck(task.name, unmodified, patched, "; ".join(problems))
