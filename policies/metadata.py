"""Scheduling metadata a client attaches to a request, validated.

Clients send ``priority`` (OpenAI body field or ``X-Vllm-Priority`` header) and
``vllm_xargs`` keys ``tenant``, ``slo_class``, ``deadline_ms`` and ``session_id`` (the agent
session a call belongs to; vLLM's own ``session_id`` field, where a route sets it, wins). Both the HTTP
layer (to answer 400) and the engine (to build views) parse them here, so the
two can never disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import attrs

from policies.errors import InvalidRequestMetadata
from policies.views import DEFAULT_TENANT

PRIORITY_MIN = -20
PRIORITY_MAX = 20
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""Names match it whole (`re.fullmatch`: no trailing newline slips through a `$`)."""
METADATA_KEYS = ("tenant", "slo_class", "deadline_ms", "session_id")
RECEIVED_KEY = "llm_serving_policies_received_s"
"""The ``vllm_xargs`` key in which the API server's middleware stamps when it received the
request (wall clock), overwriting whatever a client sent: a request's SLO clock starts
there, before vLLM parses and renders it."""


@attrs.frozen(kw_only=True)
class RequestMetadata:
    """Validated scheduling metadata of one request."""

    priority: int = 0
    tenant: str = DEFAULT_TENANT
    slo_class: str | None = None
    deadline_ms: float | None = None
    """Time budget from arrival to completion, in milliseconds."""
    session_id: str | None = None
    """The agent session (conversation) the request is one call of: a hint for policies
    that keep a session's context cached or routed together."""
    received_s: float | None = None
    """When the API server received the request (`RECEIVED_KEY`), where it stamped it."""


def _name(key: str, value: object) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidRequestMetadata(
            f"vllm_xargs.{key} must be a string of 1-128 letters, digits or '_.:-' "
            f"starting with a letter or digit, got {value!r}"
        )
    return value


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestMetadata(f"priority must be an integer, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidRequestMetadata(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX} "
            f"(lower is more urgent), got {value}"
        )
    return value


def _deadline_ms(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestMetadata(f"vllm_xargs.deadline_ms must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequestMetadata(
            f"vllm_xargs.deadline_ms must be a positive finite number, got {value!r}"
        )
    return float(value)


def _received_s(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value):
        raise InvalidRequestMetadata(f"vllm_xargs.{RECEIVED_KEY} must be a finite number, got "
                                     f"{value!r}")
    return float(value)


def parse_request_metadata(
    priority: object = 0, extra_args: Mapping[str, object] | None = None
) -> RequestMetadata:
    """Validate a request's priority and ``vllm_xargs``.

    Keys other than ``tenant``, ``slo_class``, ``deadline_ms`` and ``session_id`` are left for
    other consumers and ignored here.

    Raises:
        InvalidRequestMetadata: with a message fit to return to the client.
    """
    args = extra_args or {}
    return RequestMetadata(
        priority=_priority(priority),
        tenant=_name("tenant", args["tenant"]) if "tenant" in args else DEFAULT_TENANT,
        slo_class=_name("slo_class", args["slo_class"]) if "slo_class" in args else None,
        deadline_ms=_deadline_ms(args["deadline_ms"]) if "deadline_ms" in args else None,
        session_id=_name("session_id", args["session_id"]) if "session_id" in args else None,
        received_s=_received_s(args[RECEIVED_KEY]) if RECEIVED_KEY in args else None,
    )
