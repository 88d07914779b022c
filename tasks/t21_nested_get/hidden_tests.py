from cfgtree.paths import get_path


def test_missing_top_level():
    assert get_path({}, "a.b", 5) == 5


def test_missing_leaf_defaults_to_none():
    assert get_path({"a": {}}, "a.b.c") is None


def test_step_into_a_scalar():
    assert get_path({"a": 1}, "a.b", "d") == "d"
