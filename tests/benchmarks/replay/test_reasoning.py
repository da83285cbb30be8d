"""The ServeGen reasoning workload: deterministic, open-loop, lengths from the published PMFs."""

import pytest

from benchmarks.replay.reasoning import _clients, peak_window_s, reasoning_trace
from benchmarks.replay.workloads import load_workload


@pytest.fixture(scope="module")
def trace():
    return reasoning_trace(400, seed=3)


def test_it_is_the_same_for_a_seed_and_differs_across_seeds(trace):
    assert reasoning_trace(400, seed=3) == trace
    assert reasoning_trace(400, seed=4) != trace
    assert load_workload("reasoning", max_requests=50).requests == reasoning_trace(50).requests


def test_arrivals_start_at_zero_in_order_and_lengths_come_from_the_clients_pmfs(trace):
    arrivals = [r.arrival_s for r in trace.requests]
    assert len(arrivals) == 400 and arrivals == sorted(arrivals) and arrivals[0] >= 0
    clients = _clients()
    period = peak_window_s() % 86400 // 21600 * 21600
    for request in trace.requests:
        lengths = clients[request.tenant].lengths
        assert any(request.prompt_tokens in p[0] and request.output_tokens in p[2]
                   for start, p in lengths.items() if start >= period)


def test_outputs_are_reasoning_long(trace):
    outputs = sorted(r.output_tokens for r in trace.requests)
    assert outputs[len(outputs) // 2] > 200  # the median reasoning answer is long


def test_a_bad_count_is_refused():
    with pytest.raises(ValueError, match="num_requests must be a positive integer"):
        reasoning_trace(0)
