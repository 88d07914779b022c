from semver_lite.versions import is_newer


def test_two_digit_minor_is_newer():
    assert is_newer("1.10.0", "1.9.0")


def test_two_digit_patch_is_newer():
    assert is_newer("2.0.10", "2.0.9")


def test_older_two_digit_is_not_newer():
    assert not is_newer("0.9.1", "0.10.0")
