"""`PolicyMiddleware`: the one ASGI middleware in front of vLLM's engine routes.

Installed with ``--middleware integrations.vllm_v1.serving.middleware.PolicyMiddleware``
(`integrations.vllm_v1.serving.server.server_args` does it). On every route that
reaches the scheduler (`integrations.vllm_v1.serving.routes`), one request is one call:

1. a fresh rejection ticket, when the rejection channel is configured
   (`integrations.vllm_v1.serving.rejection_channel`);
2. the request checked before vLLM sees it: who (tenant credential), what (scheduling
   metadata), may it (tenant limits), then passed on with the credential's tenant and
   the ticket (`integrations.vllm_v1.serving.http_validation.forward_checked`);
3. with the ``slo`` preset, the door (`integrations.vllm_v1.serving.frontend`): 503 at once
   when the wait before the engine alone breaks the request's TTFT target
   (``frontend_busy``) or the requests in flight ahead of it reach the limit its class
   learned from their lateness (``concurrency_limit``);
4. the response passed through a `Responder`
   (`integrations.vllm_v1.serving.http_status`), which answers a rejection with its
   status, reason and ``Retry-After``, and names the class the engine judged
   (``x-slo-class``).

The ticket travels as a local of that call, not through the ASGI scope. Other routes
and other scope types pass straight through. On ``SIGTERM`` it drains
(`integrations.vllm_v1.serving.drain`): new engine requests and ``/health`` get 503,
requests in flight finish within the grace period or are ended, then the server stops.
Configuration (our ``--additional-config`` entry) is read once, at start-up: a bad entry
fails the start with its message.
"""

from __future__ import annotations

import time

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.config.spec import served_slo
from integrations.vllm_v1.serving.asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    app_entry,
    send_error,
)
from integrations.vllm_v1.serving.drain import HEALTH_PATHS, Drain
from integrations.vllm_v1.serving.frontend import FrontendStage
from integrations.vllm_v1.serving.http_status import Responder
from integrations.vllm_v1.serving.http_validation import forward_checked
from integrations.vllm_v1.serving.rejection_channel import RejectionBook, channel_address
from integrations.vllm_v1.serving.routes import EngineRoute, RouteTable
from integrations.vllm_v1.serving.tenants import TenantBinding

PATH = "integrations.vllm_v1.serving.middleware.PolicyMiddleware"
"""How ``--middleware`` names it."""


@attrs.define(eq=False)
class _Setup:
    routes: RouteTable
    binding: TenantBinding | None
    book: RejectionBook | None
    drain: Drain
    slo: SLOSpec | None
    """The ``slo`` preset's declaration, when served (its classes are checked)."""
    frontend: FrontendStage | None = None
    """The frontend gate, with the ``slo`` preset."""


class PolicyMiddleware:
    """Pure ASGI middleware (streaming-safe): buffers the bodies of engine-bound POSTs only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._setup: _Setup | None = None

    def setup(self, scope: Scope) -> _Setup:
        """Read the routes and our configuration from the app; start the channel (once).

        Raises:
            PipelineConfigError: a bad serving entry (tenants, gateway, channel address,
                the ``slo`` preset's declaration).
        """
        if self._setup is None:
            entry = app_entry(scope)
            slo = served_slo(entry)
            binding = TenantBinding.from_entry(entry, slo=slo)
            drain = Drain.from_entry(entry)
            address = channel_address(entry)
            book = RejectionBook(address) if address else None
            if book is not None and not book.start():
                book = None
            self._setup = _Setup(RouteTable.from_app(scope.get("app")), binding, book, drain, slo)
            self._setup.frontend = FrontendStage.from_spec(slo)
        return self._setup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        setup = self.setup(scope)
        route = setup.routes.match(scope)
        if setup.drain.draining and (route is not None or scope.get("path") in HEALTH_PATHS):
            await send_error(send, 503, "server is shutting down: retry on another instance",
                             anthropic=route is not None and route.anthropic_errors,
                             retry_after="1")
            return
        if route is None:
            await self.app(scope, receive, send)
            return
        with setup.drain.track(send, anthropic=route.anthropic_errors) as send:
            await self._engine_request(setup, route, scope, receive, send)

    async def _engine_request(self, setup: _Setup, route: EngineRoute, scope: Scope,
                              receive: Receive, send: Send) -> None:
        received_s = time.time()
        book = setup.book
        visit = setup.frontend.visit() if setup.frontend is not None else None
        leave = visit.leave if visit is not None else None
        ticket = book.expect(on_word=leave) if book is not None else None
        try:
            forward = await forward_checked(scope, receive, send, route,
                                            binding=setup.binding, ticket=ticket,
                                            slo=setup.slo, received_s=received_s)
            if forward is not None and visit is not None:
                forward = await visit.admit(forward, route, send)
            if forward is None:
                return  # answered with an error
            responder = Responder(send, route, book, ticket if forward.ticket_sent else None,
                                  on_first_message=leave,
                                  listeners=(visit,) if visit is not None else ())
            await self.app(forward.scope, forward.receive, responder.send)
        finally:
            if visit is not None:
                visit.end()
            if ticket is not None:
                book.forget(ticket)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self.setup(scope).drain.install(scope)
        except PipelineConfigError as error:  # a bad config entry: fail the start, say why
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.failed", "message": str(error)})
            return

        async def on_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete" and self._setup.book:
                self._setup.book.close()
            await send(message)

        await self.app(scope, receive, on_send)
