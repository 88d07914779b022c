"""Retry delays with exponential backoff."""


def backoff_delays(base, factor, attempts, cap=None):
    """The delay before each of ``attempts`` retries: base, base*factor, base*factor**2, ... (at most cap)."""
    delays = []
    for i in range(1, attempts):
        delay = base * factor ** (i - 1)
        delays.append(delay if cap is None else min(delay, cap))
    return delays
