"""agents/mswea.py's pure parts: the runner's environment and spec never carry the job secret; config checks."""
from pathlib import Path

import pytest

from gyre_hpc.net import auth
from gyre_hpc.agents.mswea import agent_env, run_spec
from gyre_hpc.config import MiniSweAgentConfig, load_config
from gyre_hpc.errors import ConfigError


def test_the_agent_environment_holds_only_the_run_directory_and_offline_settings(monkeypatch, tmp_path):
    monkeypatch.setenv(auth.ENV, "job-secret-123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nope")
    env = agent_env(tmp_path)
    assert "job-secret-123" not in env.values() and auth.ENV not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == str(tmp_path) and env["MSWEA_GLOBAL_CONFIG_DIR"].startswith(str(tmp_path))
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == "1"


def test_the_spec_gives_the_run_key_and_wraps_commands_only_when_isolated(monkeypatch, tmp_path):
    monkeypatch.setenv(auth.ENV, "job-secret-123")
    ws = tmp_path / "ws"
    spec = run_spec(MiniSweAgentConfig(step_limit=3), "fix it", "http://127.0.0.1:9/runs/q1-r0/v1", "run-key", ws,
                    tmp_path / "run", "gyre-policy", isolate=True)
    assert (spec["api_key"], spec["model"], spec["step_limit"]) == ("run-key", "openai/gyre-policy", 3)
    assert "job-secret-123" not in repr(spec)
    assert spec["wrap"][1:4] == ["--mount", "--net", "--"] and str(ws) in spec["wrap"]
    assert run_spec(MiniSweAgentConfig(), "t", "u", "k", ws, tmp_path, "m", isolate=False)["wrap"] == []


def test_mini_swe_agent_settings_are_checked_at_load():
    cfg = load_config(None, ["agent.kind=mini-swe-agent", "agent.tasks_dir=tasks"])
    assert cfg.agent.mini_swe_agent.step_limit >= 1
    with pytest.raises(ConfigError, match="agent.mini_swe_agent.step_limit"):
        load_config(None, ["agent.kind=mini-swe-agent", "agent.tasks_dir=tasks", "agent.mini_swe_agent.step_limit=0"])
    with pytest.raises(ConfigError, match="tasks_dir"):
        load_config(None, ["agent.kind=mini-swe-agent"])
