from timefmt.duration import parse_duration


def test_one_hour():
    assert parse_duration("1h") == 3600


def test_hours_and_minutes():
    assert parse_duration("2h5m") == 7500


def test_hours_and_seconds():
    assert parse_duration("1h1s") == 3601
