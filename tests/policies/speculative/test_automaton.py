"""`SuffixAutomaton` agrees with brute-force oracles on random and repetitive token streams."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.speculative import SuffixAutomaton
from tests.helpers.oracles import (
    occurrences,
    oracle_continuations,
    oracle_count,
    oracle_match,
    oracle_repeated_suffix,
)

small_alphabet = st.lists(st.integers(0, 2), max_size=60)
"""Repetitive streams: three symbols force long repeats, clones and deep suffix links."""
random_tokens = st.lists(st.integers(0, 50_000), max_size=60)
periodic = st.builds(lambda unit, reps, tail: (unit * reps + tail)[:80],
                     st.lists(st.integers(0, 5), min_size=1, max_size=6),
                     st.integers(1, 12), st.lists(st.integers(0, 5), max_size=4))
streams = st.one_of(small_alphabet, random_tokens, periodic)


def build(text, chunk):
    automaton = SuffixAutomaton(initial_tokens=1)
    for i in range(0, len(text), chunk):
        automaton.extend(text[i:i + chunk])
    return automaton


@settings(max_examples=150, deadline=None)
@given(text=streams, chunk=st.integers(1, 7), data=st.data())
def test_counts_and_continuations_match_brute_force(text, chunk, data):
    automaton = build(text, chunk)
    automaton.check_invariants()
    assert list(automaton.text) == text
    for _ in range(5):
        if text and data.draw(st.booleans()):
            i = data.draw(st.integers(0, len(text) - 1))
            pattern = text[i:i + data.draw(st.integers(1, 6))]
        else:
            pattern = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
        assert automaton.count(pattern) == oracle_count(text, pattern)
        assert automaton.continuations(pattern) == oracle_continuations(text, pattern)


@settings(max_examples=150, deadline=None)
@given(text=streams)
def test_repeated_suffix_is_the_longest_previous_occurrence(text):
    automaton = SuffixAutomaton()
    for i, tok in enumerate(text):
        automaton.extend([tok])
        state, length = automaton.repeated_suffix()
        assert length == oracle_repeated_suffix(text[:i + 1])
        assert (state == 0) == (length == 0)


@settings(max_examples=150, deadline=None)
@given(text=streams, stream=st.lists(st.integers(0, 3), max_size=30), split=st.integers(0, 30))
def test_streaming_match_is_the_longest_suffix_found_in_the_text(text, stream, split):
    automaton = build(text, 5)
    cursor = automaton.match(stream[:split])
    cursor = automaton.match(stream[split:], cursor)
    assert cursor[1] == oracle_match(text, stream)


@settings(max_examples=100, deadline=None)
@given(text=st.one_of(small_alphabet, periodic), stream=st.lists(st.integers(0, 3), max_size=20),
       more=st.lists(st.integers(0, 3), max_size=30))
def test_a_cursor_stays_valid_while_the_text_grows(text, stream, more):
    """Clones split classes under a live cursor: it must still land where a fresh match does.

    (Text appended later can hold a longer match than a cursor streamed before it could see;
    `SharedSuffixCache.advance` re-matches recent tokens for that.)
    """
    automaton = build(text, 3)
    cursor = automaton.match(stream)
    automaton.extend(more)
    cursor = automaton.match([1, 2], cursor)
    full = stream + [1, 2]
    length = cursor[1]
    assert length <= oracle_match(text + more, full)
    if length:
        suffix = full[len(full) - length:]
        assert occurrences(text + more, suffix)
        assert automaton.match(suffix) == cursor


@settings(max_examples=150, deadline=None)
@given(text=streams)
def test_draft_follows_the_most_frequent_continuation(text):
    automaton = build(text, 4)
    cursor = automaton.repeated_suffix()
    tokens, probs = np.zeros(8, np.int32), np.zeros(8)
    n, score = automaton.draft(cursor, 8, 0.0, tokens, probs)
    assert score == pytest.approx(probs[:n].sum())
    if cursor[1] == 0:
        assert n == 0
        return
    context = text[len(text) - cursor[1]:]
    counts = oracle_continuations(text, context)
    if not counts:
        assert n == 0
        return
    assert n >= 1
    assert counts[int(tokens[0])] == max(counts.values())
    assert probs[0] == pytest.approx(max(counts.values()) / sum(counts.values()))
    assert all(probs[i + 1] <= probs[i] for i in range(n - 1))
    # Every drafted prefix really follows the matched context somewhere in the text.
    assert occurrences(text, context + [int(t) for t in tokens[:n]])


def test_draft_stops_at_the_probability_floor_and_at_separators():
    automaton = SuffixAutomaton()
    automaton.extend([1, 2, 3, -1, 1, 2, 4, -1, 1, 2, 3, -1, 1, 2])
    tokens, probs = np.zeros(8, np.int32), np.zeros(8)
    cursor = automaton.match([7, 1, 2])
    assert cursor[1] == 2
    n, _ = automaton.draft(cursor, 8, 0.0, tokens, probs)
    assert list(tokens[:n]) == [3]  # 3 follows "1 2" twice, 4 once; then the separator
    assert probs[0] == pytest.approx(2 / 3)
    assert automaton.draft(cursor, 8, 0.7, tokens, probs)[0] == 0


def test_memory_is_compact_on_real_text_sized_input():
    rng = np.random.default_rng(0)
    words = rng.zipf(1.3, size=50_000).astype(np.int32) % 20_000
    automaton = SuffixAutomaton()
    automaton.extend(words)
    automaton.check_invariants()
    assert automaton.stats().bytes_per_token < 200


@pytest.mark.parametrize("bad", [{"initial_tokens": 0}, {"max_count_walk_states": 0}])
def test_constructor_validates(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        SuffixAutomaton(**bad)


def test_rejects_non_integer_tokens():
    with pytest.raises(ValueError, match="1-D integer sequence"):
        SuffixAutomaton().extend(np.zeros(3))
