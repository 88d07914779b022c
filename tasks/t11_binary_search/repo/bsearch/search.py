"""Binary search in sorted lists."""


def find(xs, target):
    """Index of ``target`` in sorted ``xs``, or -1 when absent."""
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return -1
