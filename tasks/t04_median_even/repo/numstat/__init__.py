"""numstat: see stats.py."""
