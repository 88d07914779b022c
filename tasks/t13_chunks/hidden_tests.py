from batching.chunk import chunks


def test_short_last_chunk():
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_fewer_items_than_size():
    assert chunks([1], 3) == [[1]]


def test_every_item_kept():
    assert sum(chunks(list(range(7)), 3), []) == list(range(7))
