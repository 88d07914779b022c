"""Tag lists for uploaded files."""


def add_tag(tag, tags=[]):
    """Return ``tags`` with ``tag`` appended (a new list when none is given)."""
    tags.append(tag.strip().lower())
    return tags
