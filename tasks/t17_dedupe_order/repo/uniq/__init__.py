"""uniq: see dedupe.py."""
