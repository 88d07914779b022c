from bsearch.search import find


def test_last_element():
    assert find([1, 3, 5], 5) == 2


def test_single_element():
    assert find([7], 7) == 0


def test_last_of_even_length():
    assert find([1, 2, 3, 4], 4) == 3
