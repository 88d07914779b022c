from numstat.stats import median


def test_even_length():
    assert median([1, 2, 3, 4]) == 2.5


def test_two_values():
    assert median([4, 1]) == 2.5


def test_unsorted_even():
    assert median([10, 2, 8, 4, 6, 12]) == 7
