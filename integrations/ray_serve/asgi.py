"""Call an ASGI application in-process and read its answer as it is produced.

An engine replica runs vLLM's own OpenAI application (`vllm serve`'s FastAPI app,
middlewares included) without a socket: `call_asgi` hands it one HTTP request and
yields the response start (status, headers), then each body chunk as the app sends
it, so a streamed answer reaches the caller event by event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class ResponseStart:
    """The first thing an ASGI app sends: status and headers (names lower-case)."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str, default: str = "") -> str:
        """The first value of header ``name`` (case-insensitive), or ``default``."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), default)


def http_scope(method: str, path: str, headers: Mapping[str, str] | None = None,
               body_length: int = 0) -> dict[str, Any]:
    """An ASGI ``http`` scope for ``method path`` with ``headers`` (``content-length`` set)."""
    path, _, query = path.partition("?")
    raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                   for k, v in (headers or {}).items()
                   if k.lower() not in ("content-length", "host")]
    raw_headers += [(b"host", b"engine"), (b"content-length", str(body_length).encode())]
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": method.upper(), "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
            "headers": raw_headers, "client": ("127.0.0.1", 0), "server": ("engine", 80),
            "state": {}}


async def call_asgi(app: Any, method: str, path: str, *, body: bytes = b"",
                    headers: Mapping[str, str] | None = None,
                    ) -> AsyncIterator[ResponseStart | bytes]:
    """Yield the app's `ResponseStart`, then every non-empty body chunk, as they come.

    Closing the generator early (the caller went away) tells the app the client
    disconnected (``http.disconnect``), so vLLM aborts the request, and waits for the
    app to return. An app that fails before sending a response start raises here.
    """
    queue: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await queue.put(message)

    async def run() -> None:
        try:
            await app(http_scope(method, path, headers, len(body)), receive, send)
        except BaseException as error:  # noqa: BLE001 - handed to the reader below
            await queue.put(error)
            raise
        finally:
            await queue.put({"type": "app.done"})

    task = asyncio.create_task(run())
    started = False
    try:
        while True:
            message = await queue.get()
            if isinstance(message, BaseException):
                raise message
            kind = message["type"]
            if kind == "http.response.start":
                started = True
                yield ResponseStart(status=int(message["status"]), headers=tuple(
                    (k.decode("latin-1").lower(), v.decode("latin-1"))
                    for k, v in message.get("headers", ())))
            elif kind == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    return
            elif kind == "app.done":
                if not started:
                    raise RuntimeError(f"{method} {path}: the app returned without a response")
                return
    finally:
        disconnected.set()
        if not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), timeout=30)
        if not task.done():
            task.cancel()
