import pytest

from envcfg.flags import env_flag


def test_false_is_false():
    assert env_flag("false") is False


def test_zero_and_off_any_case():
    assert env_flag("0") is False and env_flag(" OFF ") is False


def test_garbage_raises():
    with pytest.raises(ValueError):
        env_flag("maybe")
