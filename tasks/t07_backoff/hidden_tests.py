from retrying.backoff import backoff_delays


def test_one_delay_per_attempt():
    assert backoff_delays(1, 2, 3) == [1, 2, 4]


def test_single_attempt():
    assert backoff_delays(0.5, 3, 1) == [0.5]


def test_cap_applies_to_every_delay():
    assert backoff_delays(1, 10, 4, cap=50) == [1, 10, 50, 50]
