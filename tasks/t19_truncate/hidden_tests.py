from textutil.trunc import truncate


def test_fits_width():
    assert truncate("abcdefghij", 5) == "ab..."


def test_words():
    assert truncate("hello world", 8) == "hello..."


def test_custom_ellipsis():
    assert truncate("abcdefgh", 4, ellipsis="~") == "abc~"
