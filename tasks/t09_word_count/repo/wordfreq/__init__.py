"""wordfreq: see count.py."""
