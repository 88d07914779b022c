"""Roman numerals for chapter numbers."""

SYMBOLS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(n):
    """Roman numeral of 1 <= n <= 3999, in standard subtractive form (4 = IV)."""
    if not 1 <= n <= 3999:
        raise ValueError(n)
    out = []
    for value, symbol in SYMBOLS:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)
