"""bsearch: see search.py."""
