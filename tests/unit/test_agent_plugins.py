"""Agent and grader plugins: loading with errors that name the key, running python/command agents, grading."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_hpc.agents.plugins import grade_run, load_entry, load_plugins, run_agent, run_status
from gyre_hpc.agents.repo_tasks import load_task, make_workspace
from gyre_hpc.config import load_config
from gyre_hpc.errors import ConfigError
from gyre_hpc.trajectory.records import RunStatus

TASKS = Path(__file__).resolve().parents[2] / "tasks"
DOUBLES = Path(__file__).with_name("agent_plugins.py")
URL, KEY = "http://127.0.0.1:9/runs/r7/v1", "sk-run-r7"


def plugins_for(*overrides):
    cfg = load_config(None, ["agent.tasks_dir=tasks", *overrides])
    return load_plugins(cfg.agent, cfg.grader)


@pytest.fixture
def task():
    return load_task(TASKS / "t01_page_count")


@pytest.fixture
def workspace(task, tmp_path):
    return make_workspace(task, tmp_path)


def test_malformed_entry_fails_at_load_naming_the_dotted_key():
    with pytest.raises(ConfigError, match=r"^agent\.entry: must be 'pkg.module:callable', got 'agent_plugins'"):
        load_config(None, ["agent.kind=python", "agent.entry=agent_plugins", "agent.tasks_dir=tasks"])
    with pytest.raises(ConfigError, match=r"^grader\.entry: must be"):
        load_config(None, ["grader.entry=a b:c"])


def test_unimportable_entry_fails_before_any_run_with_the_import_error():
    with pytest.raises(ConfigError, match=r"agent\.entry: cannot import 'no_such_pkg\.mod' \(ModuleNotFoundError"):
        plugins_for("agent.kind=python", "agent.entry=no_such_pkg.mod:run")
    with pytest.raises(ConfigError, match=r"grader\.entry: module 'agent_plugins' has no attribute 'nope'"):
        plugins_for("grader.entry=agent_plugins:nope")
    with pytest.raises(ConfigError, match=r"grader\.entry: 'agent_plugins:NOT_CALLABLE' is not callable"):
        load_entry("agent_plugins:NOT_CALLABLE", "grader.entry")


def test_plugin_kinds_need_their_keys():
    with pytest.raises(ConfigError, match=r"^agent\.argv: must be a non-empty argv"):
        load_config(None, ["agent.kind=command", "agent.tasks_dir=tasks"])
    with pytest.raises(ConfigError, match=r"^agent\.tasks_dir: is required"):
        load_config(None, ["agent.kind=python", "agent.entry=agent_plugins:fixing_agent"])
    assert load_config(None).agent.kind == "synthetic"


def test_python_agent_receives_task_url_key_and_workspace_and_its_fix_scores_one(task, workspace):
    plugins = plugins_for("agent.kind=python", "agent.entry=agent_plugins:fixing_agent")
    result = run_agent(plugins, task, URL, KEY, workspace, timeout_s=30)
    assert result.status == "finished"
    assert json.loads((workspace / "seen.json").read_text()) == {"task": task.name, "base_url": URL, "api_key": KEY}
    grade = grade_run(plugins, task, workspace)
    assert (grade.status, grade.score) == (RunStatus.SCORED, 1.0)
    assert run_status(result, grade) is RunStatus.SCORED


def test_async_python_agent_runs_on_its_own_loop(task, workspace):
    plugins = plugins_for("agent.kind=python", "agent.entry=agent_plugins:async_fixing_agent",
                          "grader.entry=agent_plugins:grade_full")
    assert run_agent(plugins, task, URL, KEY, workspace, timeout_s=30).status == "finished"
    assert "-(-n_items // per_page)" in (workspace / "pager" / "pages.py").read_text()


def test_crashing_and_hanging_agents_end_crashed_or_timeout_and_are_scored_partially(task, workspace):
    for entry, status in (("crashing_agent", "crashed"), ("hanging_agent", "timeout")):
        plugins = plugins_for("agent.kind=python", f"agent.entry=agent_plugins:{entry}",
                              "grader.entry=agent_plugins:grade_partial")
        result = run_agent(plugins, task, URL, KEY, workspace, timeout_s=0.5)
        assert result.status == status
        assert run_status(result, grade_run(plugins, task, workspace)) is RunStatus.TIMEOUT_PARTIAL
    crashing = plugins_for("agent.kind=python", "agent.entry=agent_plugins:crashing_agent")
    assert "the harness crashed" in run_agent(crashing, task, URL, KEY, workspace, timeout_s=5).detail


def test_command_agent_runs_in_the_workspace_with_only_the_run_variables(task, workspace, monkeypatch):
    monkeypatch.setenv("GYRE_TEST_SECRET", "hunter2")
    argv = [sys.executable, str(DOUBLES), str(task.patch)]
    plugins = plugins_for("agent.kind=command", f"agent.argv={json.dumps(argv)}")
    result = run_agent(plugins, task, URL, KEY, workspace, timeout_s=30)
    assert result.status == "finished", result.detail
    seen = json.loads((workspace / "agent_env.json").read_text())
    assert Path(seen["cwd"]) == workspace
    assert seen["env"]["OPENAI_BASE_URL"] == URL and seen["env"]["OPENAI_API_KEY"] == KEY
    assert seen["env"]["GYRE_TASK"] == task.statement and seen["env"]["GYRE_TASK_NAME"] == task.name
    assert "GYRE_TEST_SECRET" not in seen["env"]
    assert grade_run(plugins, task, workspace).score == 1.0


def test_command_agent_exit_code_and_timeout(task, workspace, tmp_path):
    base = [sys.executable, str(DOUBLES), str(task.patch)]
    crashed = run_agent(plugins_for("agent.kind=command", f"agent.argv={json.dumps(base + ['--exit', '3'])}"),
                        task, URL, KEY, workspace, timeout_s=30)
    assert (crashed.status, crashed.returncode) == ("crashed", 3)
    fresh = make_workspace(task, tmp_path)
    hung = run_agent(plugins_for("agent.kind=command", f"agent.argv={json.dumps(base + ['--sleep', '60'])}"),
                     task, URL, KEY, fresh, timeout_s=1.0)
    assert hung.status == "timeout"


@pytest.mark.parametrize("entry, score", [("grade_full", 1.0), ("grade_partial", 0.25)])
def test_grader_plugin_scores_are_kept(task, workspace, entry, score):
    grade = grade_run(plugins_for(f"grader.entry=agent_plugins:{entry}"), task, workspace)
    assert (grade.status, grade.score) == (RunStatus.SCORED, score)


@pytest.mark.parametrize("entry, reason", [("grade_raising", "raised: ValueError: grader bug"),
                                           ("grade_hanging", "ran past grader.timeout_s=0.5"),
                                           ("grade_out_of_range", "returned 1.5, not a score in [0, 1]")])
def test_grader_plugin_that_fails_is_an_eval_failure_not_a_zero(task, workspace, entry, reason):
    plugins = plugins_for(f"grader.entry=agent_plugins:{entry}", "grader.timeout_s=0.5")
    grade = grade_run(plugins, task, workspace)
    assert (grade.status, grade.score) == (RunStatus.EVAL_FAILURE, None)
    assert reason in grade.detail
    finished = run_agent(plugins_for("agent.kind=python", "agent.entry=agent_plugins:fixing_agent"), task, URL, KEY,
                         workspace, timeout_s=30)
    assert run_status(finished, grade) is RunStatus.EVAL_FAILURE


def test_gyre_train_imports_the_agent_entry_before_starting_anything(tmp_path):
    root = TASKS.parent
    cmd = [sys.executable, "-m", "gyre_hpc.cli", "train", str(root / "configs" / "local.yaml"), "--dry-run",
           "--set", "agent.kind=python", "--set", "agent.entry=no_such_pkg.mod:run", "--set", "agent.tasks_dir=tasks",
           "--set", f"run.out_dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(DOUBLES.parent)])}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "agent.entry: cannot import 'no_such_pkg.mod' (ModuleNotFoundError" in out.stderr
    assert not any(tmp_path.iterdir())
