"""rowparse: see rows.py."""
