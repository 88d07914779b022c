"""intervals: see merge.py."""
