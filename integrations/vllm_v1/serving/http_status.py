"""ASGI middleware: requests the engine rejected become HTTP 400/429/503 (with ``Retry-After``).

The scheduler rejects a request by finishing it with ``finish_reason="abort"``
and a `Rejection`'s ``stop_reason`` before it produces a token. vLLM would answer
that with HTTP 200; this middleware holds the response (non-streaming: the whole
body; streaming: until the first event that carries a token or a finish reason)
and, if it is such a rejection, answers instead with `Rejection.http_status` (400:
the request can never succeed; 429: the client's own quota; 503: overload), a
``Retry-After`` header (not on 400) and an OpenAI-style error body. Everything
else passes through unchanged.

For a *streaming* request vLLM 0.32 drops the aborted output and sends only
``data: [DONE]``, so the reason never reaches this middleware. A stream that ends
without a token, a finish reason or an error can only be a request the engine
dropped before its first token: it becomes a 503 with ``Retry-After: 1`` whose
message says the reason is only reported for non-streaming requests.
"""

from __future__ import annotations

import json
from typing import Any

from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.http_validation import (
    VALIDATED_PATHS,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
)

MAX_HELD_BYTES = 1 << 20
STREAM_REJECTION = Rejection(
    reason="dropped", detail="before its first token (the reason is reported on "
    "non-streaming requests only)", retry_after_s=1.0)


def find_rejection(payload: Any) -> Rejection | None:
    """The scheduler's rejection, if a completion payload is one."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    for choice in choices or ():
        if not isinstance(choice, dict) or choice.get("finish_reason") != "abort":
            continue
        rejection = Rejection.parse(choice.get("stop_reason"))
        if rejection is not None:
            return rejection
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
                await _send_rejection(send, rejection)
                return
            if finished and verdict is None and state["streaming"] and not any(
                    isinstance(p, dict) and "error" in p for p in payloads):
                state["holding"] = False
                await _send_rejection(send, STREAM_REJECTION)
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


_ERROR_TYPES = {400: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}


async def _send_rejection(send: Send, rejection: Rejection) -> None:
    status = rejection.http_status
    body = json.dumps({"error": {"message": rejection.message, "type": _ERROR_TYPES[status],
                                 "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if rejection.retry_after_header is not None:
        headers.append((b"retry-after", rejection.retry_after_header.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
