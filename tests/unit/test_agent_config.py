"""The ``agent`` config section: documented fields, dotted errors for bad values, the context-budget floor."""
import dataclasses

import pytest

from gyre_hpc.config import AgentConfig, explain, load_config
from gyre_hpc.errors import ConfigError


def test_defaults_load_and_every_agent_field_is_documented():
    assert load_config(None).agent == AgentConfig()
    rows = [r for r in explain() if r[0].startswith("agent.")]
    defaults = [getattr(AgentConfig(), f.name) for f in dataclasses.fields(AgentConfig)]
    nested = [d for d in defaults if dataclasses.is_dataclass(d)]  # agent.mini_swe_agent: its row and its keys
    assert len(rows) == len(defaults) + sum(len(dataclasses.fields(d)) for d in nested)
    assert all(doc for *_, doc in rows)


@pytest.mark.parametrize("override, message", [
    ("agent.tool_failure_prob=1.5", r"agent\.tool_failure_prob: must be in \[0, 1\], got 1.5"),
    ("agent.subagent_prob=-0.1", r"agent\.subagent_prob: must be in \[0, 1\]"),
    ("agent.eval_failure_rate=2", r"agent\.eval_failure_rate: must be in \[0, 1\]"),
    ("agent.tool_time_median_s=0", r"agent\.tool_time_median_s: must be > 0"),
    ("agent.timeout_s=-1", r"agent\.timeout_s: must be > 0"),
    ("agent.tool_time_sigma=-1", r"agent\.tool_time_sigma: must be >= 0"),
    ("agent.turns=[4, 2]", r"agent\.turns: must be \[min, max\] with 0 <= min <= max, got \[4, 2\]"),
    ("agent.subagent_turns=[0, 2]", r"agent\.subagent_turns: must be \[min, max\] with 1 <= min"),
    ("agent.tool_output_tokens=[1]", r"agent\.tool_output_tokens: must be \[min, max\]"),
    ("agent.key_classes=17", r"agent\.key_classes: must be in \[1, 16\]"),
    ("agent.answer_tokens=0", r"agent\.answer_tokens: must be >= 1"),
    ("agent.top_p=0", r"agent\.top_p: must be in \(0, 1\]"),
    ("agent.top_k=0", r"agent\.top_k: must be -1 or >= 1"),
    ("agent.abort_retries=-1", r"agent\.abort_retries: must be >= 0"),
    ("agent.timeout_s=fast", r"agent\.timeout_s: expected a number"),
])
def test_bad_values_name_the_dotted_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_context_budget_must_hold_a_compressed_context_and_its_next_call():
    floor = AgentConfig().min_budget()  # system 6 + CTX SUMMARY KEY marker + task 8 + answer 8
    assert floor == 6 + 4 + 8 + 8
    assert load_config(None, [f"agent.context_budget={floor}"]).agent.context_budget == floor
    with pytest.raises(ConfigError, match=rf"agent\.context_budget: must be >= {floor} .*got {floor - 1}"):
        load_config(None, [f"agent.context_budget={floor - 1}"])
    with pytest.raises(ConfigError, match=r"agent\.context_budget: must be >= 98 .*got 96"):
        load_config(None, ["agent.answer_tokens=80"])  # a longer answer raises the floor above the default 96


def test_unknown_agent_key_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key agent\.retries; valid keys of agent: runs_per_group"):
        load_config(None, ["agent.retries=3"])
