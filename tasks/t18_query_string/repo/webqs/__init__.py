"""webqs: see query.py."""
