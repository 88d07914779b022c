"""Query strings of incoming requests."""


def parse_query(query):
    """A dict of the (percent-decoded) parameters of 'a=1&b=two+words'."""
    params = {}
    for pair in query.lstrip("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        params[key] = value
    return params
