"""The allocator config section: documented fields, strict checks naming the dotted key."""
import pytest

from gyre_hpc.config import AllocatorConfig, explain, load_config
from gyre_hpc.errors import ConfigError


def test_allocator_section_loads_with_overrides_and_every_field_is_documented():
    cfg = load_config(None, ["allocator.steps=3", "allocator.heartbeat_timeout_s=4"]).allocator
    assert (cfg.steps, cfg.heartbeat_timeout_s, cfg.heartbeat_interval_s) == (3, 4.0, 1.0)
    rows = [r for r in explain() if r[0].startswith("allocator.")]
    assert {r[0] for r in rows} == {f"allocator.{k}" for k in AllocatorConfig.__dataclass_fields__}
    assert all(doc for *_, doc in rows)


@pytest.mark.parametrize("override, match", [
    ("allocator.steps=0", "allocator.steps: must be >= 1, got 0"),
    ("allocator.heartbeat_timeout_s=1.5", r"allocator.heartbeat_timeout_s: must be >= 2 x heartbeat_interval_s = 2.0"),
    ("allocator.poll_backoff_max_s=0.00001", "allocator.poll_backoff_max_s: must be >= poll_backoff_min_s"),
    ("allocator.shutdown_timeout_s=0", "allocator.shutdown_timeout_s: must be > 0"),
    ("allocator.events_file=logs/e.jsonl", "allocator.events_file: must be a file name inside the run directory"),
    ("allocator.heartbeat=1", "unknown key allocator.heartbeat; valid keys of allocator: steps, heartbeat_interval_s"),
])
def test_bad_allocator_values_name_the_dotted_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])
