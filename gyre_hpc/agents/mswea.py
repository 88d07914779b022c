"""``agent.kind: mini-swe-agent`` (edge: subprocesses): the pinned, unmodified package, one subprocess per run.

mini-swe-agent's dependencies (litellm, openai 3.x) conflict with SGLang's pins, so it lives in its own venv
(``bash scripts/setup.sh --mini-swe-agent``; ``venv_python``) and each run is that venv's interpreter running
``mswea_runner.py`` (stdlib + minisweagent only)::

    gyre process ──spawn (clean env, rlimits, own session)──▶ venv python mswea_runner.py SPEC
                                                               │ DefaultAgent + LitellmModel ──HTTP──▶ proxy
                                                               │   (api_base = /runs/RUN/v1, api_key = run key)
                                                               └ each bash command: unshare --mount --net
                                                                 sandbox_launch.py WS RUNDIR -- /bin/sh -c CMD

Per run a run directory beside the workspace (never inside it: the grader copies the workspace) holds the spec,
the package's global config dir, the trajectory JSON and ``result.json`` (exit status, sandbox refusals).

Invariants
- The agent's environment holds only PATH, LANG, HOME/TMPDIR (the run directory) and the offline settings; the
  job's secret never reaches it: its key is the run key, which opens only its own run's endpoint.
- Every run ends: past ``agent.timeout_s`` the process group is killed and the run is ``timeout`` (graded
  partially by the harness); a missing result or a crash is ``crashed`` with the log's tail.
- A command that wrote outside the workspace or opened the network was refused by the sandbox; the run's
  detail says ``sandbox refused N`` (the run is marked, and still graded).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from gyre_hpc.agents.grader import sandbox_available
from gyre_hpc.agents.result import AgentResult
from gyre_hpc.config import MiniSweAgentConfig
from gyre_hpc.errors import ConfigError

VERSION = "2.4.6"
RUNNER = Path(__file__).with_name("mswea_runner.py")
LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
SETUP_HINT = "run `bash scripts/setup.sh --mini-swe-agent` (or set agent.mini_swe_agent.python)"


def default_venv() -> Path:
    """$GYRE_MSWEA_VENV, else ~/.cache/gyre_hpc/venv-mswea-VERSION (where scripts/setup_mswea.sh installs)."""
    if os.environ.get("GYRE_MSWEA_VENV"):
        return Path(os.environ["GYRE_MSWEA_VENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gyre_hpc" / f"venv-mswea-{VERSION}"


def venv_python(cfg: MiniSweAgentConfig) -> Path:
    """The interpreter that runs the agent; a ``ConfigError`` when it lacks mini-swe-agent==VERSION."""
    python = Path(cfg.python) if cfg.python else default_venv() / "bin" / "python"
    if not python.is_file():
        raise ConfigError(f"agent.mini_swe_agent.python: {python} does not exist; {SETUP_HINT}")
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('mini-swe-agent'))"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != VERSION:
        raise ConfigError(f"agent.mini_swe_agent.python: {python} has mini-swe-agent "
                          f"{probe.stdout.strip() or 'not installed'}, need {VERSION}; {SETUP_HINT}")
    return python


def run_spec(cfg: MiniSweAgentConfig, statement: str, base_url: str, api_key: str, workspace: Path, run_dir: Path,
             model_name: str, isolate: bool) -> dict:
    """What the runner reads: the run's endpoint and key, its paths, limits, and how each command is wrapped."""
    wrap = [shutil.which("unshare") or "unshare", "--mount", "--net", "--", sys.executable, "-I", str(LAUNCHER),
            str(workspace), str(run_dir), "--"] if isolate else []
    return {"task": statement, "base_url": base_url, "api_key": api_key, "model": f"openai/{model_name}",
            "workspace": str(workspace), "run_dir": str(run_dir), "step_limit": cfg.step_limit,
            "command_timeout_s": cfg.command_timeout_s, "wrap": wrap,
            "command_env": {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                            "HOME": str(run_dir), "TMPDIR": str(run_dir / "tmp"), "LANG": "C.UTF-8",
                            "PYTHONDONTWRITEBYTECODE": "1", "PAGER": "cat"}}


def agent_env(run_dir: Path) -> dict[str, str]:
    """The runner's whole environment: no job variable, offline settings for litellm and mini-swe-agent."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(run_dir),
            "TMPDIR": str(run_dir / "tmp"), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true",
            "LITELLM_LOG": "ERROR", "MSWEA_SILENT_STARTUP": "1", "MSWEA_CONFIGURED": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": str(run_dir / "mswea-config"), "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def run_mswea_agent(cfg: MiniSweAgentConfig, statement: str, base_url: str, api_key: str, workspace: Path,
                    timeout_s: float, model_name: str = "gyre-policy", python: Path | None = None):
    """Run mini-swe-agent once on ``statement`` in ``workspace``; returns an ``AgentResult``."""

    isolate = cfg.isolation != "off" and sandbox_available()
    if cfg.isolation == "required" and not isolate:
        return AgentResult("crashed", "agent.mini_swe_agent.isolation is required, but no sandbox can be made "
                                      "here (needs root and unshare with mount and network namespaces)")
    python = python or venv_python(cfg)
    workspace = Path(workspace).resolve()
    run_dir = workspace.parent / f"{workspace.name}.mswea"
    (run_dir / "tmp").mkdir(parents=True, exist_ok=True)
    spec = run_spec(cfg, statement, base_url, api_key, workspace, run_dir, model_name, isolate)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    limits = {resource.RLIMIT_CPU: cfg.cpu_s, resource.RLIMIT_AS: cfg.memory_mb << 20,
              resource.RLIMIT_FSIZE: cfg.file_mb << 20, resource.RLIMIT_CORE: 0}

    def preexec() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))

    try:
        proc = subprocess.Popen([str(python), "-I", str(RUNNER), str(run_dir / "spec.json")], cwd=workspace,
                                env=agent_env(run_dir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=preexec, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            return AgentResult("timeout", f"mini-swe-agent ran past {timeout_s:g} s{_refusals(run_dir)}")
        return _result(run_dir, proc.returncode, log.decode(errors="replace")[-800:].strip())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _refusals(run_dir: Path) -> str:
    """``; sandbox refused N (...)`` from the trajectory's observations, or ``""``."""
    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return ""
    n = result.get("refused", 0)
    return f"; sandbox refused {n} ({', '.join(result.get('refusals', []))})" if n else ""


def _result(run_dir: Path, returncode: int, tail: str):

    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return AgentResult("crashed", f"mini-swe-agent exit {returncode}, no result: {tail}", returncode)
    detail = f"mini-swe-agent {result.get('exit_status')}, {result.get('steps', 0)} calls{_refusals(run_dir)}"
    if returncode != 0 or result.get("error"):
        return AgentResult("crashed", f"{detail}: {result.get('error') or tail}", returncode)
    return AgentResult("finished", detail, 0)
