from webqs.query import parse_query


def test_plus_is_space():
    assert parse_query("name=John+Smith") == {"name": "John Smith"}


def test_percent_escape():
    assert parse_query("?q=a%26b&x=1") == {"q": "a&b", "x": "1"}


def test_encoded_key():
    assert parse_query("first%20name=Ann") == {"first name": "Ann"}
