"""cfgtree: see paths.py."""
