"""tagging: see tags.py."""
