"""Durations like '1h30m' or '45s'."""

import re

UNITS = {"s": 1, "m": 60, "h": 360}
_PART = re.compile(r"(\d+)([hms])")


def parse_duration(text):
    """Seconds in a duration such as '2h5m10s'."""
    parts = _PART.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * UNITS[u] for n, u in parts)
