"""calendar_utils: see leap.py."""
