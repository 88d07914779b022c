from wordfreq.count import count_words


def test_case_insensitive():
    assert count_words("The the THE") == {"the": 3}


def test_punctuation_ignored():
    assert count_words("Hi, hi.") == {"hi": 2}


def test_lone_punctuation_is_not_a_word():
    assert count_words("yes - No no!") == {"yes": 1, "no": 2}
