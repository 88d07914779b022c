"""Small descriptive statistics without numpy."""


def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    """The median of a non-empty sequence."""
    if not xs:
        raise ValueError("median of an empty sequence")
    ordered = sorted(xs)
    return ordered[len(ordered) // 2]
