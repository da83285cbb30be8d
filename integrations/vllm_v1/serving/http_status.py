"""A request the engine rejected gets its real status, reason and ``Retry-After`` (`Responder`).

The scheduler rejects a request by finishing it with ``finish_reason="abort"`` and a
`Rejection`'s ``stop_reason`` before it produces a token. vLLM answers that with
HTTP 200, and on most paths loses the reason: a stream holds only ``data: [DONE]``,
``/v1/responses`` says ``"status": "completed"`` with empty output, ``/v1/messages``
an empty text with ``"end_turn"``. On every route that reaches the scheduler
(`integrations.vllm_v1.serving.routes`) `PolicyMiddleware`
(`integrations.vllm_v1.serving.middleware`) sends the response through a `Responder`,
which holds a 200 response until it carries output (a token, a tool call, a normal finish) and passes it through
from then on. A response that ends without output is a rejection if

* its payload says so (completions and chat, non-streaming: ``stop_reason`` is the
  encoded `Rejection`), or
* the rejection channel (`integrations.vllm_v1.serving.rejection_channel`) reported
  the request's ticket (every route whose body carries ``vllm_xargs``, streaming or not).

It is then answered with `Rejection.http_status` (400: retrying cannot help; 429: the
client's own quota; 503: overload), ``Retry-After`` (429/503: the policy's
``retry_after_s`` rounded up, at least 1) and an error body in the route's format
whose message names the reason. Responses with output, and errors, pass unchanged.

Every response the engine judged says how (`Judged.headers`): ``x-slo-class``, the class
the request was judged in (an admitted request's, from the channel, waiting at most
`CLASS_WAIT_S` for it; an SLO rejection's, from its detail) and, for a demoted request,
``x-slo-demoted-from``, the class it asked for. Without the channel's word, no header.
A stream's first token and its last chunk are timed as they leave (wall clock) and told to
the response's `StreamListener`s: the engine's (`TicketReports`, so that admission learns the
path outside the engine) and the frontend's (`integrations.vllm_v1.serving.frontend`).

Without the channel (vLLM started by hand without it), a completions or chat stream
that ends without a token, a finish reason or an error can only be a request dropped
before its first token: it becomes 503 with ``Retry-After: 1`` and a message saying
the reason is unknown (`UNKNOWN_STREAM_REJECTION`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.asgi import Message, Send, send_error
from integrations.vllm_v1.serving.rejection_channel import Judged, RejectionBook
from integrations.vllm_v1.serving.routes import EngineRoute

MAX_HELD_BYTES = 1 << 20
"""A response held this long without output is passed through."""
CHANNEL_WAIT_S = 2.0
"""How long a response without output waits for the channel's word on its ticket."""
CLASS_WAIT_S = 0.01
"""How long a response's first chunk waits for the class the engine judged (sent on
admission, so normally there long before the first token), once the engine has announced
any class (an engine whose admission judges none is never waited for)."""
SLO_REASONS = frozenset({"slo_ttft", "slo_tpot"})
"""Rejection reasons whose detail is the class the request was judged in."""
UNKNOWN_STREAM_REJECTION = Rejection(
    reason="dropped", detail="before its first token (reason unknown: no rejection channel)",
    retry_after_s=1.0)
_OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call",
                  "refusal")


def payload_rejection(payload: Any) -> Rejection | None:
    """The rejection a completions/chat payload (or stream chunk) encodes, if all of it is one."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not choices or not isinstance(choices, list):
        return None
    found = None
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("finish_reason") != "abort":
            return None
        if _choice_output(choice):
            return None
        found = found or Rejection.parse(choice.get("stop_reason"))
    return found


def has_output(payload: Any) -> bool:
    """Whether a response payload or stream event shows the request ran (output or a normal
    finish), in the OpenAI (completions, chat, batch), Responses or Anthropic format."""
    if not isinstance(payload, dict):
        return False
    if "error" in payload:
        return True  # an error is not a rejection: pass it on
    usage = payload.get("usage")
    if usage is None and isinstance(payload.get("response"), dict):
        usage = payload["response"].get("usage")  # a Responses stream's final event
    if isinstance(usage, dict) and any(_positive(usage.get(k)) for k in
                                       ("completion_tokens", "output_tokens")):
        return True
    choices = payload.get("choices")
    if isinstance(choices, list):
        return any(isinstance(c, dict) and (_choice_output(c) or c.get("finish_reason")
                                            not in (None, "abort")) for c in choices)
    kind = payload.get("type")
    if isinstance(kind, str) and kind.endswith(".delta"):  # Responses stream
        return bool(payload.get("delta"))
    if kind == "content_block_delta":  # Anthropic stream
        delta = payload.get("delta") or {}
        return any(delta.get(k) for k in ("text", "partial_json", "thinking"))
    if kind == "content_block_start":
        return (payload.get("content_block") or {}).get("type") == "tool_use"
    if kind == "message":  # Anthropic, whole
        return any(isinstance(b, dict) and (b.get("text") or b.get("type") == "tool_use")
                   for b in payload.get("content") or ())
    if payload.get("object") == "response":  # Responses, whole
        if payload.get("status") in ("queued", "in_progress"):
            return True  # a background response: it has not run yet, nothing to explain
        return any(isinstance(item, dict) and (item.get("type") != "message" or any(
            isinstance(part, dict) and part.get("text") for part in item.get("content") or ()))
            for item in payload.get("output") or ())
    return False


def _choice_output(choice: dict) -> bool:
    if choice.get("text") or choice.get("token_ids"):
        return True
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, dict) and any(part.get(f) for f in _OUTPUT_FIELDS):
            return True
    return False


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def sse_payloads(body: bytes) -> list[Any]:
    """The JSON payloads of the complete SSE ``data:`` lines in ``body``."""
    payloads = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            try:
                payloads.append(json.loads(line[5:]))
            except ValueError:
                continue
    return payloads


class StreamListener(Protocol):
    """Told when a stream's first token leaves and when the stream ends (wall clock), and of
    the class the engine judged it in."""

    def first_token(self, sent_s: float) -> None: ...

    def stream_end(self, first_s: float, last_s: float, chunks: int) -> None:
        """``chunks``: the ``data:`` events after the first token's, plus one."""

    def judged(self, judged: Judged) -> None:
        """The class the engine judged the request in (once known, before its first token)."""


@attrs.frozen
class TicketReports:
    """A stream's timing reported to the engine over the channel, under its ticket."""

    book: RejectionBook
    ticket: str

    def first_token(self, sent_s: float) -> None:
        self.book.report_first_token(self.ticket, sent_s)

    def stream_end(self, first_s: float, last_s: float, chunks: int) -> None:
        self.book.report_stream_end(self.ticket, first_s, last_s, chunks)

    def judged(self, judged: Judged) -> None:
        """The engine judged it."""


@attrs.define(eq=False)
class Responder:
    """Holds one response until it shows output (pass it on) or ends without (maybe a
    rejection); ``ticket``: the one the engine saw (None: it can report nothing)."""

    downstream: Send
    route: EngineRoute
    book: RejectionBook | None
    ticket: str | None
    on_first_message: Callable[[], None] | None = None
    """Called when vLLM sends the response's first message."""
    listeners: tuple[StreamListener, ...] = ()
    """Told of a stream's first token and end (besides the engine's, when it has a ticket)."""
    held: list[Message] = attrs.Factory(list)
    body: bytearray = attrs.Factory(bytearray)
    holding: bool = True
    answered: bool = False
    streaming: bool = False
    stream_times: list[float] | None = None
    """[first token sent, last chunk sent, chunks] once a stream's first token left (told to
    the listeners when the stream ends)."""

    def __attrs_post_init__(self) -> None:
        if self.book is not None and self.ticket is not None:
            self.listeners = (TicketReports(self.book, self.ticket), *self.listeners)

    async def send(self, message: Message) -> None:
        if self.on_first_message is not None:
            on_first, self.on_first_message = self.on_first_message, None
            on_first()
        if self.answered:
            return  # the response was replaced by a rejection: drop the rest
        if not self.holding:
            await self.downstream(message)
            if self.stream_times is not None:
                self._stream_sent(message)
            return
        if message["type"] == "http.response.start":
            self.held.append(message)
            if message.get("status") != 200:
                await self._release()
                return
            headers = dict(message.get("headers", []))
            self.streaming = b"text/event-stream" in headers.get(b"content-type", b"")
            return
        self.held.append(message)
        self.body += message.get("body", b"")
        more = message.get("more_body", False)
        if self.streaming:
            for payload in sse_payloads(bytes(self.body)):
                if (rejection := payload_rejection(payload)) is not None:
                    await self._answer(rejection)
                    return
                if has_output(payload):
                    await self._release()
                    if "error" not in payload:
                        self._first_token_sent(time.time())
                    return
        if more:
            if len(self.body) > MAX_HELD_BYTES:
                await self._release()
            return
        rejection = await self._rejection_at_end()
        if rejection is not None:
            await self._answer(rejection)
        else:
            await self._release()

    async def _rejection_at_end(self) -> Rejection | None:
        """Why a complete response without output (so far) produced nothing, if it was rejected."""
        if self.streaming:
            payloads = sse_payloads(bytes(self.body))
        else:
            payloads = [json_or_none(bytes(self.body))]
            if (rejection := payload_rejection(payloads[0])) is not None:
                return rejection
            if has_output(payloads[0]):
                return None
        if self.book is not None and self.ticket is not None:
            rejection = await self.book.wait(self.ticket, CHANNEL_WAIT_S)
            if rejection is not None:
                return rejection
        if self.streaming and not any(isinstance(p, dict) and "error" in p for p in payloads) \
                and all(isinstance(p, dict) and "choices" in p for p in payloads):
            return UNKNOWN_STREAM_REJECTION  # an OpenAI stream with no finish: dropped
        return None

    async def _answer(self, rejection: Rejection) -> None:
        self.holding = False
        self.answered = True
        judged = self._judged_now()
        if judged is None and rejection.reason in SLO_REASONS and rejection.detail:
            judged = Judged(rejection.detail)
        await send_error(with_judged_headers(self.downstream, judged), rejection.http_status,
                         rejection.message, anthropic=self.route.anthropic_errors,
                         retry_after=rejection.retry_after_header)

    async def _release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        if held and held[0]["type"] == "http.response.start":
            judged = self._judged_now()
            if judged is None and held[0].get("status") == 200 and self.ticket is not None \
                    and self.book is not None and self.book.hears_classes:
                judged = await self.book.wait_judged(self.ticket, CLASS_WAIT_S)
            held[0] = _started_with(held[0], judged)
            if judged is not None:
                for listener in self.listeners:
                    listener.judged(judged)
        for message in held:
            await self.downstream(message)

    def _judged_now(self) -> Judged | None:
        if self.book is None or self.ticket is None:
            return None
        return self.book.judged(self.ticket)

    def _first_token_sent(self, sent_s: float) -> None:
        if self.listeners:
            self.stream_times = [sent_s, sent_s, 1]
            for listener in self.listeners:
                listener.first_token(sent_s)

    def _stream_sent(self, message: Message) -> None:
        """Time the stream's chunks as they leave (counting ``data:`` events, unparsed: this
        runs for every chunk); tell the listeners when it ends."""
        times = self.stream_times
        body = message.get("body", b"")
        if body:
            chunks = body.count(b"data:") - body.count(b"data: [DONE]")
            if chunks > 0:
                times[1] = time.time()
                times[2] += chunks
        if not message.get("more_body", False):
            self.stream_times = None
            first_s, last_s, chunks = times
            for listener in self.listeners:
                listener.stream_end(first_s, last_s, int(chunks))


def _started_with(start: Message, judged: Judged | None) -> Message:
    """A ``http.response.start`` message with ``judged``'s headers added."""
    if judged is None:
        return start
    return {**start, "headers": [*start.get("headers", []), *judged.headers()]}


def with_judged_headers(send: Send, judged: Judged | None) -> Send:
    """``send`` with ``judged``'s headers added to the response's start."""
    if judged is None:
        return send

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = _started_with(message, judged)
        await send(message)

    return sending


def json_or_none(body: bytes) -> Any:
    """``body`` parsed as JSON, or None when it is not JSON (or nested too deeply)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
