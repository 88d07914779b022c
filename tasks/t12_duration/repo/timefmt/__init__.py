"""timefmt: see duration.py."""
