"""semver_lite: see versions.py."""
