"""retrying: see backoff.py."""
