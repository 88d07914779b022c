"""The live harness for plugin agents (edge): each run is a user agent on a repository-repair task, via the proxy.

Per run (group ``g`` = query ``q{g:05d}`` = task ``tasks[g % len(tasks)]``, run ``q{g:05d}-r{i}``)::

    make_workspace(task)                     a fresh copy of the task's repo/ (never the hidden tests)
    run_agent(..., base_url, api_key, ws)    base_url = PROXY/runs/RUN/v1 (the proxy's OpenAI endpoint records
                                             every chat call token-exact in TITO), api_key = run_api_key(RUN)
    grade_run(task, ws)                      the hidden tests (or grader.entry), in a sandbox
    run_status(agent, grade)                 SCORED | TIMEOUT_PARTIAL | EVAL_FAILURE
    outcome → <out_dir>/RUN.jsonl and POST /tito/outcome; the workspace is removed

It has the synthetic ``Harness``'s interface (``run_async(groups) -> [RunResult]``), so ``live.rollouts`` runs
either. Agents and graders run in worker threads (``asyncio.to_thread``): a run never blocks the event loop.

Invariants (tests/integration/test_plugin_harness.py)
- Every started run writes exactly one outcome; a grader failure is EVAL_FAILURE (excluded, never a 0); an agent
  that times out or crashes is still graded (TIMEOUT_PARTIAL), or TIMEOUT_UNSCORABLE with
  ``agent.partial_scoring: false``; a harness error (e.g. no workspace) is ABORTED with the reason.
- The agent sees only its workspace, its run's base URL and key; two runs never share a workspace.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Sequence

import httpx

from gyre_hpc.net import auth, tls
from gyre_hpc.agents.harness import RunResult, _post
from gyre_hpc.agents.plugins import Plugins, grade_run, load_plugins, run_agent, run_status
from gyre_hpc.agents.repo_tasks import RepoTask, load_tasks, make_workspace
from gyre_hpc.clock import Clock, WallClock
from gyre_hpc.config import AgentConfig, GraderConfig
from gyre_hpc.engines.client import KEEPALIVE
from gyre_hpc.errors import ConfigError
from gyre_hpc.trajectory.records import Outcome, RunStatus, write_tito


def run_api_key(run_id: str, secret: str | None = None) -> str:
    """The OpenAI API key a run's agent gets: its run key (``auth.run_key``), which reaches only this run's
    endpoint, never the job secret. Without a job secret (a proxy started outside a job) a placeholder."""
    secret = secret if secret is not None else auth.job_secret()
    return auth.run_key(secret, run_id) if secret else f"gyre-run-{run_id}"


def run_base_url(proxy_url: str, run_id: str) -> str:
    return f"{proxy_url.rstrip('/')}/runs/{run_id}/v1"


class PluginHarness:
    def __init__(self, agent: AgentConfig, grader: GraderConfig, url: str, out_dir: str | Path,
                 plugins: Plugins | None = None, tasks: Sequence[RepoTask] | None = None,
                 workspace_parent: str | Path | None = None, clock: Clock | None = None):
        if tasks is None:
            if agent.tasks_dir is None:
                raise ConfigError("agent.tasks_dir: plugin agents need a tasks directory (e.g. tasks/)")
            tasks = load_tasks(agent.tasks_dir)
        if not tasks:
            raise ConfigError(f"agent.tasks_dir: {agent.tasks_dir} holds no task")
        self.cfg, self.url, self.out_dir = agent, url, Path(out_dir)
        self.plugins = plugins if plugins is not None else load_plugins(agent, grader)
        self.tasks = tuple(tasks)
        self.workspace_parent = workspace_parent
        self.clock = clock or WallClock()  # wall(): the outcomes' stamps in TITO

    def task_of(self, gid: int) -> RepoTask:
        return self.tasks[gid % len(self.tasks)]

    async def run_async(self, groups: Sequence[int]) -> list[RunResult]:
        # the harness (not the agent) posts outcomes: it holds the job secret; the pool drops idle connections
        # before the server does (engines.client.KEEPALIVE: a post on a closing connection loses its outcome)
        transport = httpx.AsyncHTTPTransport(retries=1, limits=KEEPALIVE, verify=tls.context())
        async with httpx.AsyncClient(base_url=self.url, timeout=30.0, transport=transport,
                                     headers=auth.bearer(auth.job_secret())) as posts:
            runs = [(g, i) for g in groups for i in range(self.cfg.runs_per_group)]
            return list(await asyncio.gather(*(self._run(posts, g, i) for g, i in runs)))

    def run(self, groups: Sequence[int]) -> list[RunResult]:
        return asyncio.run(self.run_async(groups))

    async def _run(self, posts: httpx.AsyncClient, gid: int, index: int) -> RunResult:
        query_id = f"q{gid:05d}"
        run_id, task = f"{query_id}-r{index}", self.task_of(gid)
        workspace = None
        try:
            workspace = await asyncio.to_thread(make_workspace, task, self.workspace_parent)
            agent = await asyncio.to_thread(run_agent, self.plugins, task, run_base_url(self.url, run_id),
                                            run_api_key(run_id), workspace, self.cfg.timeout_s)
            grade = await asyncio.to_thread(grade_run, self.plugins, task, workspace)
            status = run_status(agent, grade)
            score = grade.score
            if status is RunStatus.TIMEOUT_PARTIAL and not self.cfg.partial_scoring:
                status, score = RunStatus.TIMEOUT_UNSCORABLE, None
            detail = f"task {task.name}; agent {agent.status}: {agent.detail[-300:]}; grade: {grade.detail}"
            outcome = Outcome(run_id, query_id, status, score, self.clock.wall(), detail)
        except Exception as exc:  # noqa: BLE001 - the harness's own failure: the run still gets an outcome
            outcome = Outcome(run_id, query_id, RunStatus.ABORTED, None, self.clock.wall(),
                              f"task {task.name}: harness error {type(exc).__name__}: {exc}")
        except BaseException as exc:  # the harness itself is cancelled: still no run is lost
            write_tito(self.out_dir / f"{run_id}.jsonl", [], [Outcome(
                run_id, query_id, RunStatus.ABORTED, None, self.clock.wall(),
                f"harness stopped: {type(exc).__name__}")])
            raise
        finally:
            if workspace is not None:
                shutil.rmtree(workspace, ignore_errors=True)
        path = write_tito(self.out_dir / f"{run_id}.jsonl", [], [outcome])
        return RunResult(run_id, outcome, (), path, {}, await _post(posts, outcome))
