"""Hypothesis workloads for driving the real scheduler through the harness."""

from hypothesis import strategies as st


def workloads(*, max_output_tokens: int, max_requests: int):
    """Lists of ``(arrival step, prompt tokens, output tokens, shared-prefix group)``;
    requests of one group share a prefix, so they hit vLLM's prefix cache."""
    return st.lists(
        st.tuples(
            st.integers(0, 6),
            st.integers(1, 200),
            st.integers(1, max_output_tokens),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=max_requests,
    )
