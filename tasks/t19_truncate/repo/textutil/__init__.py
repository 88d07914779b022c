"""textutil: see trunc.py."""
