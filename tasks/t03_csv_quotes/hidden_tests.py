from rowparse.rows import parse_row


def test_quoted_comma_stays_in_its_field():
    assert parse_row('a,"b,c",d') == ["a", "b,c", "d"]


def test_only_a_quoted_field():
    assert parse_row('"x,y"\n') == ["x,y"]


def test_doubled_quote_is_a_literal_quote():
    assert parse_row('"say ""hi""",2') == ['say "hi"', "2"]
