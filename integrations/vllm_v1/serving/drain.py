"""`Drain`: on ``SIGTERM`` the API server finishes what it serves, ends the rest, and stops.

vLLM's own ``SIGTERM`` handler aborts every request in flight (its streams end with
``finish_reason: "abort"``). `PolicyMiddleware` installs `Drain` in its place at
start-up (vLLM's handler stays on ``SIGINT``). After ``SIGTERM``:

* a new request on an engine route gets **503** with ``Retry-After: 1``, and
  ``/health`` answers 503 (not ready), so a load balancer or Kubernetes sends new
  traffic elsewhere;
* requests in flight run to their end, for at most ``drain_grace_s`` seconds (our
  config entry, default `DEFAULT_GRACE_S`; 0: stop at once, as vLLM does);
* at the end of the grace period every request still in flight is aborted in the
  engine (which stops computing it): a stream that has started gets vLLM's final
  chunk with ``finish_reason: "abort"`` (and ``data: [DONE]``), and a request whose
  response has not started (every non-streaming one) gets **503** naming the shutdown;
* a response still open `END_WAIT_S` later (e.g. not yet in the engine) is ended by the
  drain: 503 if it had not started, else an SSE error event naming the shutdown (and
  ``data: [DONE]`` on OpenAI routes), and the body closed;
* then the server stops as on ``SIGINT`` (vLLM's own shutdown).

So the process exits at most about ``drain_grace_s`` + `END_WAIT_S` seconds plus the
engine's shutdown after ``SIGTERM``, whatever its clients do. Kubernetes'
``terminationGracePeriodSeconds`` must exceed that, or the pod is killed mid-drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.serving.asgi import Message, Scope, Send, error_body, send_error

DRAIN_KEY = "drain_grace_s"
"""Our config entry's key for the grace period, in seconds."""
DEFAULT_GRACE_S = 30.0
END_WAIT_S = 5.0
"""After the engine aborted what was in flight, how long responses may take to end by
themselves before the drain ends them."""
SEND_TIMEOUT_S = 1.0
"""How long the drain waits on a client to take one final message."""
HEALTH_PATHS = ("/health", "/ready")
"""Paths that report readiness: 503 while draining."""
DRAINING_MESSAGE = "server is shutting down: retry on another instance"
STOPPED_MESSAGE = ("server shut down before the request finished (drain grace period "
                   "over): retry on another instance")
_LOG = logging.getLogger("vllm.llm_serving_policies")


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # vLLM's own shutdown


@attrs.define(eq=False)
class _Flight:
    """One engine request in flight: its response as the client has seen it so far."""

    drain: Drain
    downstream: Send
    anthropic: bool
    task: asyncio.Task | None
    started: bool = False
    """The response's start went to the client."""
    streaming: bool = False
    ended: bool = False
    """Its last body message went to the client."""
    answered: bool = False
    """The drain answered it: the app's own messages are dropped from then on."""

    async def send(self, message: Message) -> None:
        """The app's ``send``: passed on, except a response starting after the grace period
        (answered 503 instead) and anything after the drain answered."""
        if self.answered:
            return
        if message["type"] == "http.response.start":
            if self.drain.stopping:
                await self.end()
                return
            self.started = True
            headers = dict(message.get("headers", []))
            self.streaming = b"text/event-stream" in headers.get(b"content-type", b"")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self.downstream(message)

    async def end(self) -> None:
        """Answer for the app: 503 if nothing was sent yet, else an SSE error event naming
        the shutdown (a stream) and the end of the body."""
        self.answered = True
        if not self.started:
            self.started = self.ended = True
            await send_error(self.downstream, 503, STOPPED_MESSAGE, anthropic=self.anthropic,
                             retry_after="1")
            return
        if self.ended:
            return
        self.ended = True
        body = b""
        if self.streaming:
            error = error_body(503, STOPPED_MESSAGE, anthropic=self.anthropic)
            body = (b"event: error\ndata: " + error + b"\n\n" if self.anthropic
                    else b"data: " + error + b"\n\ndata: [DONE]\n\n")
        await self.downstream({"type": "http.response.body", "body": body, "more_body": False})


@attrs.define(eq=False, kw_only=True)
class Drain:
    """Tracks the engine requests in flight; after `begin`, refuses new ones, ends those
    still in flight after ``grace_s`` (aborted in the engine), and stops the server."""

    grace_s: float = DEFAULT_GRACE_S
    end_wait_s: float = END_WAIT_S
    stop_server: Callable[[], None] = attrs.field(default=_sigint, repr=False)
    """Called once the drain is over: ``SIGINT`` to this process (vLLM's own shutdown)."""
    draining: bool = attrs.field(default=False, init=False)
    stopping: bool = attrs.field(default=False, init=False)
    """The grace period is over: what is in flight is being ended."""
    _flights: set[_Flight] = attrs.field(factory=set, init=False, repr=False)
    _idle: asyncio.Event | None = attrs.field(default=None, init=False, repr=False)
    _engine: Any = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Drain:
        """The drain our config entry asks for.

        Raises:
            PipelineConfigError: ``drain_grace_s`` is not a number >= 0.
        """
        grace = entry.get(DRAIN_KEY, DEFAULT_GRACE_S)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace \
                < float("inf"):
            raise PipelineConfigError(f"{CONFIG_KEY}.{DRAIN_KEY} must be a number of seconds "
                                      f">= 0, got {grace!r}")
        return cls(grace_s=float(grace))

    @property
    def in_flight(self) -> int:
        """Engine requests whose response has not ended."""
        return len(self._flights)

    def install(self, scope: Scope) -> bool:
        """Take over ``SIGTERM`` on the running loop, and find the app's engine client (in
        the lifespan ``scope``) to abort requests with; False where signals cannot be
        handled (not the main thread, e.g. an app served in-process)."""
        state = getattr(scope.get("app"), "state", None)
        self._engine = getattr(state, "engine_client", None)
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.begin)
        except (RuntimeError, ValueError, NotImplementedError):
            return False
        return True

    def begin(self) -> None:
        """Stop admitting; stop the server when the requests in flight are done or ended."""
        if self.draining:
            return
        self.draining = True
        _LOG.info("SIGTERM: draining %d request(s) in flight for up to %.0f s",
                  self.in_flight, self.grace_s)
        asyncio.get_running_loop().create_task(self._stop())

    async def _stop(self) -> None:
        if not await self._idle_within(self.grace_s):
            self.stopping = True
            _LOG.info("drain grace period over: ending %d request(s) in flight",
                      self.in_flight)
            await self._abort_in_engine()
            if not await self._idle_within(self.end_wait_s):
                await self._end_the_rest()
        _LOG.info("drained (%d request(s) still in flight): stopping", self.in_flight)
        self.stop_server()

    async def _idle_within(self, timeout_s: float) -> bool:
        """Whether no request is in flight, waiting up to ``timeout_s``."""
        if self._flights:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)
        return not self._flights

    async def _abort_in_engine(self) -> None:
        """Abort every request in the engine: their outputs end with ``abort``."""
        if self._engine is None:
            return
        try:
            await asyncio.wait_for(self._engine.pause_generation(mode="abort",
                                                                 clear_cache=False),
                                   self.end_wait_s)
        except Exception:  # a dead or stuck engine: the drain ends the responses itself
            _LOG.exception("drain: aborting the requests in the engine failed")

    async def _end_the_rest(self) -> None:
        """End each response still open, and cancel the task that serves it."""
        for flight in list(self._flights):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(flight.end(), SEND_TIMEOUT_S)
            flight.answered = True
            if flight.task is not None:
                flight.task.cancel()

    @contextlib.contextmanager
    def track(self, send: Send, *, anthropic: bool = False) -> Iterator[Send]:
        """Around one engine request (in the task serving it): counted in flight until
        its response has been answered; yields the ``send`` the app must use."""
        flight = _Flight(self, send, anthropic, asyncio.current_task())
        self._flights.add(flight)
        try:
            yield flight.send
        except asyncio.CancelledError:
            if flight.task is None or not flight.answered:
                raise
            flight.task.uncancel()  # the drain ended it: the response is complete
        finally:
            self._flights.discard(flight)
            if not self._flights and self._idle is not None:
                self._idle.set()
