from uniq.dedupe import dedupe


def test_keeps_first_occurrence_order():
    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]


def test_strings():
    assert dedupe(["b", "a", "b"]) == ["b", "a"]


def test_descending_input():
    assert dedupe([9, 8, 9, 7]) == [9, 8, 7]
