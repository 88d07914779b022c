"""The policy name is checked once, in config (``PolicyName``); the allocator implements exactly those names."""
import pytest

from gyre_hpc.allocator import policies
from gyre_hpc.config import POLICY_NAMES, SchedulerConfig, check_policy_name, load_config
from gyre_hpc.errors import ConfigError


def test_the_allocator_implements_exactly_the_policies_config_names():
    assert set(policies._CLASSES) == set(POLICY_NAMES)


@pytest.mark.parametrize("override, key", [("scheduler.policy=nope", r"scheduler\.policy"),
                                           ("sim.policies=[gyre,nope]", r"sim\.policies\[1\]")])
def test_a_config_with_an_unknown_policy_fails_at_load_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key + r": 'nope' is not one of 'gyre', 'colocate'"):
        load_config(None, [override])


def test_a_name_that_bypassed_the_loader_fails_with_the_same_check():
    assert check_policy_name("colocate") == "colocate"
    with pytest.raises(ConfigError, match=r"scheduler\.policy: 'nope' is not one of"):
        policies.make_policy("nope", SchedulerConfig(), 4)
