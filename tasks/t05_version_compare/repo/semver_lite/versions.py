"""Version strings like 1.10.2."""


def is_newer(candidate, current):
    """True if version ``candidate`` is strictly newer than ``current``."""
    return candidate.strip() > current.strip()
