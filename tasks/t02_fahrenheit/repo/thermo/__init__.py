"""thermo: see convert.py."""
