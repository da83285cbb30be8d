"""ASGI middleware: requests the engine rejected become HTTP 429/503 with ``Retry-After``.

The scheduler rejects a request by finishing it with ``finish_reason="abort"``
and ``stop_reason="rejected:<reason>;retry_after_s=<s>"`` before it produces a
token. vLLM would answer that with HTTP 200; this middleware holds the response
(non-streaming: the whole body; streaming: until the first event that carries a
token or a finish reason) and, if it is such a rejection, answers instead with
429 (the client's own quota: rate limits, class or tenant limits) or 503 (the
server is overloaded), a ``Retry-After`` header and an OpenAI-style error body.
Everything else passes through unchanged.

For a *streaming* request vLLM 0.32 drops the aborted output and sends only
``data: [DONE]``, so the reason never reaches this middleware. A stream that ends
without a token, a finish reason or an error can only be a request the engine
dropped before its first token: it becomes a 503 with ``Retry-After: 1`` whose
message says the reason is only reported for non-streaming requests.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from integrations.vllm_v1.serving.http_validation import VALIDATED_PATHS, ASGIApp, Message, Receive, Scope, Send

REJECTION = re.compile(r"^rejected:(?P<reason>[^;]*);retry_after_s=(?P<retry>[0-9.eE+-]+)$")
CLIENT_QUOTA_PREFIXES = ("rate_limited", "class_full", "tenant_")
"""Reasons that are the client's own quota (429); every other rejection is overload (503)."""
MAX_HELD_BYTES = 1 << 20
STREAM_REJECTION = ("dropped before its first token (the reason is reported on "
                    "non-streaming requests only)")


def rejection_status(reason: str) -> int:
    """429 for a client's quota, 503 for server overload."""
    return 429 if reason.startswith(CLIENT_QUOTA_PREFIXES) else 503


def find_rejection(payload: Any) -> tuple[str, float] | None:
    """``(reason, retry_after_s)`` if a completion payload is a scheduler rejection."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    for choice in choices or ():
        stop = choice.get("stop_reason") if isinstance(choice, dict) else None
        match = REJECTION.match(stop) if isinstance(stop, str) else None
        if match and choice.get("finish_reason") == "abort":
            return match["reason"], float(match["retry"])
    return None


def _events(body: bytes) -> list[Any]:
    """JSON payloads of the complete SSE ``data:`` lines in ``body``."""
    payloads = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                payloads.append(json.loads(line[6:]))
            except ValueError:
                continue
    return payloads


def _decided(payload: Any) -> bool:
    """Whether a stream event carries a token or a finish reason (the verdict is in)."""
    for choice in payload.get("choices") or () if isinstance(payload, dict) else ():
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") or choice.get("text") or delta.get("content"):
            return True
    return False


class RejectionStatusMiddleware:
    """Pure ASGI middleware for the completion endpoints; other paths pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in VALIDATED_PATHS:
            await self.app(scope, receive, send)
            return
        held: list[Message] = []
        state = {"holding": True, "body": b"", "streaming": False}

        async def hold(message: Message) -> None:
            if not state["holding"]:
                await send(message)
                return
            held.append(message)
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                state["streaming"] = b"text/event-stream" in headers.get(b"content-type", b"")
                return
            state["body"] += message.get("body", b"")
            finished = not message.get("more_body", False)
            payloads = _events(state["body"]) if state["streaming"] else (
                [_json(state["body"])] if finished else [])
            verdict = next((p for p in payloads if find_rejection(p) or _decided(p)), None)
            if verdict is not None and (rejection := find_rejection(verdict)):
                state["holding"] = False
                await _send_rejection(send, *rejection)
                return
            if finished and verdict is None and state["streaming"] and not any(
                    isinstance(p, dict) and "error" in p for p in payloads):
                state["holding"] = False
                await _send_rejection(send, STREAM_REJECTION, 1.0)
                return
            if verdict is not None or finished or len(state["body"]) > MAX_HELD_BYTES:
                state["holding"] = False
                for queued in held:
                    await send(queued)

        await self.app(scope, receive, hold)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


async def _send_rejection(send: Send, reason: str, retry_after_s: float) -> None:
    status = rejection_status(reason)
    retry_after = str(max(1, math.ceil(retry_after_s)))
    body = json.dumps({"error": {
        "message": f"request rejected by the scheduler: {reason}; retry after {retry_after} s",
        "type": "RateLimitError" if status == 429 else "ServiceUnavailableError",
        "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"retry-after", retry_after.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
