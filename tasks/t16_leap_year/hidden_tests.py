from calendar_utils.leap import days_in_year, is_leap


def test_1900_is_common():
    assert not is_leap(1900)


def test_2100_is_common():
    assert not is_leap(2100)


def test_days_in_1800():
    assert days_in_year(1800) == 365
