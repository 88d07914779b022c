"""URL slugs for article titles."""

import re


def slugify(title):
    """Lower-case words joined by single dashes, e.g. 'Hello, World!' -> 'hello-world'."""
    return re.sub(r"[^a-z0-9]", "-", title.lower())
