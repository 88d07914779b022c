from slugs.slug import slugify


def test_punctuation_and_space_collapse():
    assert slugify("Hello, World!") == "hello-world"


def test_leading_space():
    assert slugify("  Leading space") == "leading-space"


def test_dashes_in_title():
    assert slugify("a -- b") == "a-b"
