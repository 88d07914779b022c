"""Pagination helpers for list endpoints."""


def page_count(n_items, per_page):
    """Number of pages needed to show n_items, per_page at a time (the last page may be partial)."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return n_items // per_page


def page_bounds(page, per_page):
    """(start, stop) indices of 1-based page number ``page``."""
    start = (page - 1) * per_page
    return start, start + per_page
