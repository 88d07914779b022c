"""containers: see stack.py."""
