"""Dotted-path access into nested configuration dicts."""


def get_path(tree, dotted, default=None):
    """tree['a']['b'] for 'a.b', or ``default`` when any step is missing or not a dict."""
    node = tree
    for key in dotted.split("."):
        node = node[key]
    return node
