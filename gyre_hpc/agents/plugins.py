"""Agent and grader plugins (edge: imports user code, runs subprocesses): load them early, run them per run.

The config names them (docs/agents.md)::

    agent.kind: python    agent.entry: "pkg.module:run"     run(task=, base_url=, api_key=, workspace=), sync or async
    agent.kind: mini-swe-agent   the pinned package in its own venv, commands sandboxed (agents/mswea.py)
    agent.kind: command   agent.argv: [prog, arg, ...]      cwd = workspace; OPENAI_BASE_URL, OPENAI_API_KEY,
                                                            GYRE_TASK (the statement), GYRE_TASK_NAME, GYRE_WORKSPACE
    grader.entry: "pkg.module:grade"                        grade(task=, workspace=) -> score in [0, 1]
    (no grader.entry: the task's hidden tests, gyre_hpc.agents.grader)

``load_plugins`` imports every entry before a run starts; ``run_agent`` runs one agent in a fresh workspace with a
timeout; ``grade_run`` grades it; ``run_status`` combines the two into the run's ``RunStatus``.

Hook point: the live harness (agents/harness.py) plays the synthetic agent over ``/generate``. A plugin agent
needs the proxy's OpenAI endpoint (``/runs/{run_id}/v1``, issue 11 part 1); once it exists, the harness calls,
per run, ``make_workspace`` → ``run_agent`` (in a thread: ``asyncio.to_thread``) → ``grade_run`` →
``run_status``, and posts the outcome to the proxy, which recorded the calls.

Invariants
- A bad entry string fails at config load (config.check_entry); an entry that cannot be imported, or is not
  callable, fails in ``load_plugins`` with a ``ConfigError`` naming the dotted key and the import error.
- An agent that hangs, crashes or exits non-zero ends ``timeout`` or ``crashed`` and is still graded
  (TIMEOUT_PARTIAL: partial credit); an agent that returns ends ``finished`` (SCORED).
- A grader that raises, hangs past grader.timeout_s, or returns anything but a number in [0, 1] makes the run an
  EVAL_FAILURE with the reason, never a score of 0.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import os
import signal
import subprocess
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gyre_hpc.agents.grader import Grade, grade_hidden_tests
from gyre_hpc.agents.repo_tasks import RepoTask
from gyre_hpc.agents.result import AgentResult
from gyre_hpc.config import AgentConfig, GraderConfig, MiniSweAgentConfig
from gyre_hpc.errors import ConfigError
from gyre_hpc.trajectory.records import RunStatus

#: Variables a command agent inherits from the job (nothing else: no tokens, no cluster credentials).
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


def load_entry(entry: str, key: str) -> Callable[..., Any]:
    """Import ``pkg.module:attr`` now; failures are a ``ConfigError`` naming ``key`` and the import error."""
    module_name, _, attr_path = entry.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a config problem of this key
        raise ConfigError(f"{key}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{key}: {entry!r} is not callable (got {type(obj).__name__})")
    return obj


@dataclass(frozen=True)
class Plugins:
    """The loaded agent and grader: ``agent`` for kind python, ``argv`` for kind command, ``grader`` or None."""

    kind: str
    agent: Callable[..., Any] | None
    argv: tuple[str, ...]
    grader: Callable[..., Any] | None
    grader_cfg: GraderConfig
    mswea: MiniSweAgentConfig | None = None  # kind mini-swe-agent: its config and venv interpreter (agents/mswea.py)
    mswea_python: Path | None = None


def load_plugins(agent: AgentConfig, grader: GraderConfig) -> Plugins:
    """Import the configured entries (call it before any run starts)."""
    fn = load_entry(agent.entry, "agent.entry") if agent.kind == "python" and agent.entry else None
    grade = load_entry(grader.entry, "grader.entry") if grader.entry else None
    if agent.kind == "mini-swe-agent":
        from gyre_hpc.agents.mswea import venv_python

        return Plugins(agent.kind, None, (), grade, grader, agent.mini_swe_agent, venv_python(agent.mini_swe_agent))
    return Plugins(agent.kind, fn, agent.argv if agent.kind == "command" else (), grade, grader)


def _call_with_timeout(fn: Callable[..., Any], kwargs: dict, timeout_s: float) -> tuple[str, Any]:
    """("ok", value) | ("timeout", None) | ("raised", traceback text); async results run on their own loop.

    A sync callable that hangs cannot be stopped from Python: its daemon thread is abandoned (documented).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            value = fn(**kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(asyncio.wait_for(_awaited(value), timeout_s))
            box["ok"] = value
        except asyncio.TimeoutError:
            box["timeout"] = True
        except BaseException:  # noqa: BLE001 - user code: every failure is reported, none escapes the thread
            box["raised"] = traceback.format_exc(limit=4)

    thread = threading.Thread(target=target, name=f"plugin-{getattr(fn, '__name__', 'fn')}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive() or "timeout" in box:
        return "timeout", None
    return ("ok", box["ok"]) if "ok" in box else ("raised", box["raised"])


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def run_agent(plugins: Plugins, task: RepoTask, base_url: str, api_key: str, workspace: Path,
              timeout_s: float) -> AgentResult:
    """Run the configured plugin agent once on ``task`` in ``workspace`` (fresh, made by ``make_workspace``)."""
    if plugins.kind == "python" and plugins.agent is not None:
        kwargs = {"task": task, "base_url": base_url, "api_key": api_key, "workspace": Path(workspace)}
        how, value = _call_with_timeout(plugins.agent, kwargs, timeout_s)
        if how == "timeout":
            return AgentResult("timeout", f"the agent ran past {timeout_s:g} s")
        return AgentResult("finished") if how == "ok" else AgentResult("crashed", value)
    if plugins.kind == "command":
        return run_command_agent(plugins.argv, task, base_url, api_key, Path(workspace), timeout_s)
    if plugins.kind == "mini-swe-agent" and plugins.mswea is not None:
        from gyre_hpc.agents.mswea import run_mswea_agent

        return run_mswea_agent(plugins.mswea, task.statement, base_url, api_key, Path(workspace), timeout_s,
                               python=plugins.mswea_python)
    raise ConfigError(f"agent.kind: {plugins.kind!r} is not a plugin agent (python or command)")


def run_command_agent(argv: tuple[str, ...], task: RepoTask, base_url: str, api_key: str, workspace: Path,
                      timeout_s: float) -> AgentResult:
    """Run ``argv`` with cwd = ``workspace`` and the run's OpenAI variables; its process group dies on timeout."""
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, GYRE_TASK=task.statement, GYRE_TASK_NAME=task.name,
               GYRE_WORKSPACE=str(workspace))
    try:
        proc = subprocess.Popen(list(argv), cwd=workspace, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return AgentResult("crashed", f"cannot start {argv[0]!r}: {exc}")
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return AgentResult("timeout", f"the agent ran past {timeout_s:g} s", None)
    tail = log.decode(errors="replace")[-800:].strip()
    if proc.returncode != 0:
        return AgentResult("crashed", f"exit {proc.returncode}: {tail}", proc.returncode)
    return AgentResult("finished", tail, 0)


def grade_run(plugins: Plugins, task: RepoTask, workspace: Path) -> Grade:
    """The grader plugin's score, or the hidden tests' share passed when no grader.entry is set."""
    if plugins.grader is None:
        return grade_hidden_tests(task, workspace, plugins.grader_cfg)
    timeout_s = plugins.grader_cfg.timeout_s
    how, value = _call_with_timeout(plugins.grader, {"task": task, "workspace": Path(workspace)}, timeout_s)
    if how == "timeout":
        return Grade.failure(f"grader.entry ran past grader.timeout_s={timeout_s:g}")
    if how == "raised":
        return Grade.failure(f"grader.entry raised: {value.strip().splitlines()[-1]}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value <= 1.0) \
            or math.isnan(value):
        return Grade.failure(f"grader.entry returned {value!r}, not a score in [0, 1]")
    return Grade(RunStatus.SCORED, float(value), detail="grader.entry")


def run_status(agent: AgentResult, grade: Grade) -> RunStatus:
    """EVAL_FAILURE when grading failed; else SCORED for a finished agent, TIMEOUT_PARTIAL otherwise."""
    if grade.status is RunStatus.EVAL_FAILURE:
        return RunStatus.EVAL_FAILURE
    return RunStatus.SCORED if agent.status == "finished" else RunStatus.TIMEOUT_PARTIAL
