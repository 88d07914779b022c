"""Boolean feature flags from environment variables."""

import os


def env_flag(value):
    """Interpret an environment value: 1/true/yes/on are true, 0/false/no/off and empty are false."""
    return value.strip() != ""


def flag_from_env(name, default=False):
    value = os.environ.get(name)
    return default if value is None else env_flag(value)
