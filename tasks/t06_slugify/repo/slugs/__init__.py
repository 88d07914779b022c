"""slugs: see slug.py."""
