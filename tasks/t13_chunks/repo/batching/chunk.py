"""Splitting work into batches."""


def chunks(items, size):
    """Consecutive lists of ``size`` items; the last one may be shorter."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
