"""What the serving middlewares share: ASGI types, our config entry, bodies, error responses.

OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}`` (vLLM's
``ErrorResponse``); Anthropic's ``/v1/messages`` answers
``{"type": "error", "error": {"type", "message"}}``. A 429 or 503 carries
``Retry-After`` (whole seconds); a 4xx that retrying cannot fix carries none.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from integrations.vllm_v1.config.spec import config_entry

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPENAI_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
                 413: "RequestTooLarge", 429: "RateLimitError", 503: "ServiceUnavailableError"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error"}


MAX_BODY_BYTES = 64 << 20
"""Request bodies larger than this get 413."""


def app_entry(scope: Scope) -> Mapping[str, Any]:
    """Our ``--additional-config`` entry, as vLLM parsed it for this app ({} if none).

    vLLM builds middlewares with no arguments, but stores its parsed command line on
    the app (``app.state.args``), and Starlette puts the app in every scope.
    """
    args = getattr(getattr(scope.get("app"), "state", None), "args", None)
    return config_entry(getattr(args, "additional_config", None))


async def read_body(receive: Receive, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The whole request body, or None if it is larger than ``limit`` or the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, then: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then whatever ``then`` yields."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


def error_body(status: int, message: str, *, anthropic: bool = False) -> bytes:
    """The JSON error body for ``status`` in OpenAI's (default) or Anthropic's format."""
    if anthropic:
        payload: dict[str, Any] = {"type": "error", "error": {
            "type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    else:
        payload = {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "Error"),
                             "param": None, "code": status}}
    return json.dumps(payload).encode()


async def send_error(send: Send, status: int, message: str, *, anthropic: bool = False,
                     retry_after: str | None = None) -> None:
    """Answer with ``status``, an error body and (for 429/503) ``Retry-After``."""
    body = error_body(status, message, anthropic=anthropic)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
