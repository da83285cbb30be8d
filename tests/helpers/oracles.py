"""Brute-force oracles for the suffix automaton's tests."""


def occurrences(text, pattern):
    m = len(pattern)
    return [i for i in range(len(text) - m + 1) if text[i:i + m] == pattern]


def oracle_count(text, pattern):
    return len(occurrences(text, pattern))


def oracle_continuations(text, pattern):
    out = {}
    for i in occurrences(text, pattern):
        if i + len(pattern) < len(text):
            tok = text[i + len(pattern)]
            out[tok] = out.get(tok, 0) + 1
    return out


def oracle_repeated_suffix(text):
    """Length of the longest suffix that also ends earlier in ``text``."""
    n = len(text)
    return max((m for m in range(1, n) if any(text[i:i + m] == text[n - m:]
                                              for i in range(n - m))), default=0)


def oracle_match(text, stream):
    """Length of the longest suffix of ``stream`` that occurs in ``text``."""
    return max((m for m in range(1, len(stream) + 1)
                if occurrences(text, stream[len(stream) - m:])), default=0)
