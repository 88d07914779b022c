"""pager: see pages.py."""
