"""envcfg: see flags.py."""
