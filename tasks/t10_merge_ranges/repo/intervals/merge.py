"""Merging of [start, end] ranges (inclusive)."""


def merge_ranges(ranges):
    """Merge overlapping ranges; the result is sorted and non-overlapping."""
    merged = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
