from numerals.roman import to_roman


def test_four():
    assert to_roman(4) == "IV"


def test_forty_nine():
    assert to_roman(49) == "XLIX"


def test_1994():
    assert to_roman(1994) == "MCMXCIV"
