"""Removing duplicates from user-supplied lists."""


def dedupe(items):
    """The items without repeats, in the order of their first occurrence."""
    return sorted(set(items))
