import pytest

from reporting.percent import percent


def test_one_eighth():
    assert percent(1, 8) == 12.5


def test_one_third():
    assert percent(1, 3) == pytest.approx(33.3333, rel=1e-4)


def test_small_share():
    assert percent(1, 200) == 0.5
