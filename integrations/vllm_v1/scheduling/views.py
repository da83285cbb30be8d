"""vLLM objects in, policy views out: the only translation between the two."""

from __future__ import annotations

from integrations.vllm_v1.vllm_surface.names import Request
from policies import RequestMetadata, RequestView, parse_request_metadata

MAX_FRONTEND_S = 60.0
"""The most seconds a request may have spent in the API server before vLLM stamped its
``arrival_time``; an earlier ``received_s`` is not believed (a clock step, a forged key)."""


def request_metadata(request: Request) -> RequestMetadata:
    """Validated priority, tenant, class and deadline of a vLLM request.

    Raises:
        InvalidRequestMetadata: if ``priority`` or ``vllm_xargs`` are unacceptable.
    """
    params = request.sampling_params
    extra_args = params.extra_args if params is not None else None
    return parse_request_metadata(request.priority, extra_args)


def arrival_s(request: Request, metadata: RequestMetadata) -> float:
    """When the request's clock starts: when the API server received it, where its middleware
    stamped that (`RECEIVED_KEY`) no more than `MAX_FRONTEND_S` before vLLM's ``arrival_time``;
    else ``arrival_time``."""
    received = metadata.received_s
    arrival = request.arrival_time
    if received is not None and arrival - MAX_FRONTEND_S <= received <= arrival:
        return received
    return arrival


def request_view(request: Request, metadata: RequestMetadata,
                 cached_tokens: int = 0) -> RequestView:
    """A frozen view of ``request`` as it stands now (``cached_tokens``: found on admission)."""
    arrival = arrival_s(request, metadata)
    deadline_s = (
        arrival + metadata.deadline_ms / 1000.0
        if metadata.deadline_ms is not None
        else None
    )
    return RequestView(
        request_id=request.request_id,
        arrival_s=arrival,
        prompt_tokens=request.num_prompt_tokens,
        priority=metadata.priority,
        computed_tokens=request.num_computed_tokens,
        output_tokens=request.num_output_tokens,
        max_output_tokens=request.max_tokens,
        tenant=metadata.tenant,
        slo_class=metadata.slo_class,
        deadline_s=deadline_s,
        num_preemptions=request.num_preemptions,
        cached_tokens=cached_tokens,
        session_id=request.session_id or metadata.session_id,
    )
