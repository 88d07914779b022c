import pytest

from thermo.convert import to_celsius, to_fahrenheit


def test_freezing_point():
    assert to_fahrenheit(0) == pytest.approx(32.0)


def test_boiling_point():
    assert to_fahrenheit(100) == pytest.approx(212.0)


def test_round_trip():
    assert to_celsius(to_fahrenheit(37.5)) == pytest.approx(37.5)
