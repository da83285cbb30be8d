"""OutputLengths: the mean residual output of a request, from recent finished requests."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import OutputLengths


def test_before_anything_finishes_a_new_request_expects_the_default_within_its_limit():
    lengths = OutputLengths(default_tokens=256)
    assert lengths.remaining(0) == 256 and lengths.remaining(0, limit=100) == 100
    assert lengths.mean() == 256
    assert lengths.remaining(100) == 156, "the rest of the prior"
    assert lengths.remaining(300) == 300, "past the prior: as many again as it has generated"


def test_a_request_past_the_mean_of_a_heavy_tail_expects_more_not_zero():
    lengths = OutputLengths()
    for tokens in [100] * 90 + [10_000] * 10:  # mean 1,090
        lengths.observe(tokens)
    assert lengths.remaining(0) == pytest.approx(1090)
    # Past 100 tokens only the long ones are left: 10,000 - 2,000 more.
    assert lengths.remaining(2000) == pytest.approx(8000)
    assert lengths.remaining(2000, limit=4000) == pytest.approx(2000), "cut at max_tokens"
    assert lengths.remaining(20_000) == 20_000, "longer than any seen: as long again"
    assert lengths.remaining(5000, limit=5000) == 0


def test_only_the_last_memory_lengths_are_remembered():
    lengths = OutputLengths(memory=3)
    for tokens in (1000, 10, 20, 30):
        lengths.observe(tokens)
    assert lengths.observations == 3 and lengths.mean() == pytest.approx(20)
    lengths.check_invariants()


def test_a_request_that_generated_nothing_is_not_remembered():
    lengths = OutputLengths()
    lengths.observe(0)
    assert lengths.observations == 0


@given(st.lists(st.integers(1, 5000), max_size=60), st.integers(1, 20),
       st.floats(0, 6000), st.one_of(st.just(math.inf), st.integers(1, 6000)))
def test_remaining_is_the_mean_residual_life_of_the_remembered_lengths(
        observed, memory, generated, limit):
    lengths = OutputLengths(memory=memory)
    for tokens in observed:
        lengths.observe(tokens)
    lengths.check_invariants()
    kept = observed[-memory:]
    longer = [min(length, limit) - generated for length in kept if length > generated]
    room = max(limit - generated, 0.0)
    if longer:
        expected = min(max(sum(longer) / len(longer), 0.0), room)
    elif kept:
        expected = min(max(generated, 1.0), room)
    else:
        expected = min(max(256 - generated, generated), room)
    got = lengths.remaining(generated, limit)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert 0 <= got <= room


def test_remaining_quantiles_spread_a_request_over_its_equally_likely_finishes():
    lengths = OutputLengths()
    for tokens in range(10, 1010, 10):  # 10, 20, ..., 1000
        lengths.observe(tokens)
    spread = lengths.remaining_quantiles(500, 5)
    assert spread == sorted(spread) and len(spread) == 5
    assert spread[0] < 100 < 400 < spread[-1] <= 500, "soon for some, late for others"
    assert sum(spread) / 5 == pytest.approx(lengths.remaining(500), rel=0.05)
    assert max(lengths.remaining_quantiles(500, 5, limit=700)) == 200
    assert lengths.remaining_quantiles(5000, 3) == [5000] * 3, "longer than any: as in remaining"
    assert OutputLengths().remaining_quantiles(0, 2, limit=100) == [100, 100]
