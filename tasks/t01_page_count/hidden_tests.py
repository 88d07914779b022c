from pager.pages import page_count


def test_partial_last_page_counts():
    assert page_count(10, 3) == 4


def test_fewer_items_than_a_page():
    assert page_count(1, 10) == 1


def test_many_pages_with_remainder():
    assert page_count(101, 10) == 11
