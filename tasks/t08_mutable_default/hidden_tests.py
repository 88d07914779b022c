from tagging.tags import add_tag


def test_calls_without_a_list_are_independent():
    add_tag("first")
    assert add_tag("Second ") == ["second"]


def test_given_list_does_not_leak_into_later_calls():
    assert add_tag("b", ["a"]) == ["a", "b"]
    add_tag("noise")
    assert add_tag("c") == ["c"]


def test_three_calls():
    add_tag("x")
    add_tag("y")
    assert add_tag("z") == ["z"]
