"""`percentile`: linear interpolation between the closest ranks, the definition of every p50/p99."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.percentile import percentile

values_st = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50)


def test_reads_the_rank_q_over_100_times_n_minus_one_and_interpolates():
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40, ranks 0..3
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0  # rank 1.5
    assert percentile(values, 99) == pytest.approx(39.7)  # rank 2.97


@given(values_st, st.floats(0, 100))
def test_it_is_numpys_default_and_lies_between_the_extremes(values, q):
    result = percentile(values, q)
    assert result == float(np.percentile(values, q))
    assert min(values) <= result <= max(values)


@given(values_st, st.floats(0, 100), st.floats(0, 100))
def test_a_higher_q_is_never_lower(values, q, r):
    low, high = sorted((q, r))
    assert percentile(values, low) <= percentile(values, high)


@pytest.mark.parametrize(("values", "q", "message"), [
    ([], 50, "percentile of no values"),
    ([1.0], 101, r"q must be in \[0, 100\], got 101"),
    ([1.0], -1, r"q must be in \[0, 100\], got -1"),
])
def test_refuses_no_values_and_a_q_outside_0_to_100(values, q, message):
    with pytest.raises(ValueError, match=message):
        percentile(values, q)
