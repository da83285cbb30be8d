"""ASGI middleware: reject bad scheduling metadata with HTTP 400 before the engine sees it.

vLLM itself answers 400 for wrong JSON types; this adds our range and semantic
checks (priority range, tenant/class names, positive deadline) with the same
messages the engine would use, so a client never has to read a silent abort.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from policies import InvalidRequestMetadata, parse_request_metadata

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

VALIDATED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_BODY_BYTES = 64 << 20


def validation_error(body: bytes, headers: dict[str, str]) -> str | None:
    """Why this request body's scheduling metadata is unacceptable, or None if it is fine.

    Bodies that are not JSON objects are left to vLLM's own validation.
    """
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    priority: object = payload.get("priority", 0)
    if "x-vllm-priority" in headers:  # vLLM lets the header override the body
        try:
            priority = int(headers["x-vllm-priority"])
        except ValueError:
            return f"X-Vllm-Priority must be an integer, got {headers['x-vllm-priority']!r}"
    extra_args = payload.get("vllm_xargs")
    if extra_args is not None and not isinstance(extra_args, dict):
        return None  # vLLM's schema answers this one
    try:
        parse_request_metadata(priority, extra_args)
    except InvalidRequestMetadata as error:
        return str(error)
    return None


class SchedulingMetadataValidator:
    """Pure ASGI middleware (streaming-safe): buffers POST bodies of completion endpoints only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] not in VALIDATED_PATHS):
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                await _send_error(send, 413, f"request body larger than {MAX_BODY_BYTES} bytes")
                return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        error = validation_error(body, headers)
        if error is not None:
            await _send_error(send, 400, error)
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body,
                                        "more_body": False}], receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "BadRequestError"
                                 if status == 400 else "RequestTooLarge",
                                 "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
