"""Views of vLLM requests: a request's SLO clock starts when the API server received it."""

import types

import pytest

from integrations.vllm_v1.scheduling.views import MAX_FRONTEND_S, arrival_s, request_view
from policies import InvalidRequestMetadata, parse_request_metadata
from policies.metadata import RECEIVED_KEY


def vllm_request(arrival_time):
    return types.SimpleNamespace(request_id="r", arrival_time=arrival_time, num_prompt_tokens=8,
                                 num_computed_tokens=0, num_output_tokens=0, max_tokens=4,
                                 num_preemptions=0, session_id=None)


@pytest.mark.parametrize(("received", "expected"), [
    (99.2, 99.2),                      # 0.8 s in the API server before vLLM stamped it
    (None, 100.0),                     # no middleware: vLLM's arrival_time
    (100.5, 100.0),                    # after vLLM's stamp: not believed
    (100.0 - MAX_FRONTEND_S - 1, 100.0),  # too long before: not believed
])
def test_the_clock_starts_when_the_server_received_the_request(received, expected):
    extra = {} if received is None else {RECEIVED_KEY: received}
    metadata = parse_request_metadata(0, {"deadline_ms": 1000, **extra})
    request = vllm_request(100.0)
    assert arrival_s(request, metadata) == expected
    view = request_view(request, metadata)
    assert view.arrival_s == expected and view.deadline_s == expected + 1.0


def test_a_received_time_that_is_not_a_number_is_invalid_metadata():
    with pytest.raises(InvalidRequestMetadata, match=RECEIVED_KEY):
        parse_request_metadata(0, {RECEIVED_KEY: "yesterday"})
