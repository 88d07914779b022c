from intervals.merge import merge_ranges


def test_unsorted_input():
    assert merge_ranges([(5, 7), (1, 3), (2, 4)]) == [(1, 4), (5, 7)]


def test_later_range_swallows_earlier():
    assert merge_ranges([(10, 12), (1, 11)]) == [(1, 12)]


def test_reverse_order_disjoint():
    assert merge_ranges([(8, 9), (4, 5), (0, 1)]) == [(0, 1), (4, 5), (8, 9)]
