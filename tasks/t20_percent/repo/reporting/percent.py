"""Percentages for the summary table."""


def percent(part, total):
    """``part`` as a percentage of ``total`` (a float); 0.0 when total is 0."""
    if total == 0:
        return 0.0
    return part * 100 // total
