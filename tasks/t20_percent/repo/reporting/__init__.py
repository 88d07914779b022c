"""reporting: see percent.py."""
