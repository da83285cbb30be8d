"""An OpenAI-compatible router in front of prefill and decode vLLM servers (aiohttp).

`PDProxy` serves ``/v1/completions`` and ``/v1/chat/completions`` (streaming or
not). Per request it asks a router (`policies.pd.router.PDRouter` or a baseline)
for a prefill and a decode instance (passing the request's session, see
`request_session_id`: `PDRouter` keeps a session's turns together), then speaks vLLM's ``kv_transfer_params``
protocol: the prefill instance gets the request with ``max_tokens=1``, no stream
and ``kv_transfer_params={"do_remote_decode": true, ...}``; the decode instance
gets the original request plus the ``kv_transfer_params`` the prefill answer
returned (none with ``ExampleConnector``, which keys KV by the prompt) and its
answer is relayed to the client.

Guarantees:

- A malformed request gets 400 and no backend sees it.
- A request whose backend fails *before any byte reached the client* is retried
  on other instances, at most ``max_attempts`` times in all; the failed instance
  is marked down until a health check passes. With no healthy decode instance
  the answer is 503; when every attempt failed, 502. Both carry an OpenAI-style
  error body naming the reason.
- A stream whose decode instance fails midway ends with an SSE ``error`` event
  (then ``[DONE]``), never silently.
- ``/metrics`` (Prometheus text) counts requests by outcome, routing decisions by
  reason, retries and failovers, and shows each instance's health and in-flight
  requests; ``/health`` answers 200 while a decode instance is up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from policies.metadata import NAME_PATTERN
from policies.pd.router import InstanceLoad, RouteDecision, chain_keys

CHARS_PER_TOKEN = 4
"""Rough text-to-token ratio for load estimates (the proxy has no tokenizer)."""
_RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class BackendError(Exception):
    """A backend failed (connection error or 5xx) before the client saw anything."""


class _Refused(Exception):
    """A backend answered 4xx: the client's request is at fault; relay the answer."""

    def __init__(self, status: int, payload: bytes, content_type: str) -> None:
        super().__init__(status)
        self.response = web.Response(body=payload, status=status, content_type=content_type)


def validation_error(body: object, endpoint: str) -> str | None:
    """Why ``body`` cannot be routed, or None. Checks only what routing relies on."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if endpoint == "completions":
        prompt = body.get("prompt")
        if not (isinstance(prompt, str) and prompt) and not (
                isinstance(prompt, list) and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            return "prompt must be a non-empty string or a non-empty list of token ids"
    else:
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                        for m in messages)):
            return "messages must be a non-empty list of objects with a string role"
    if not isinstance(body.get("stream", False), bool):
        return "stream must be a boolean"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            return f"{key} must be a positive integer"
    if body.get("n", 1) != 1:
        return "n must be 1 behind the PD router"
    if "kv_transfer_params" in body:
        return "kv_transfer_params is set by the router, not by clients"
    return None


REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""The ``kv_transfer_params`` a prefill request carries: compute the prompt's KV and keep it
for a decode instance to pull."""


def prefill_request(body: dict) -> dict:
    """The request a prefill instance gets for the client's ``body`` (left unchanged): the same
    prompt with one output token, no stream, and `REMOTE_DECODE`."""
    request = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": dict(REMOTE_DECODE)}
    request.pop("stream_options", None)
    if "max_completion_tokens" in request:
        request["max_completion_tokens"] = 1
    return request


def request_session_id(body: Mapping[str, Any]) -> str | None:
    """The agent session a request body names: vLLM's own ``session_id`` field, else
    ``vllm_xargs.session_id``; None when neither is a valid name (routing then ignores it)."""
    xargs = body.get("vllm_xargs")
    for value in (body.get("session_id"), xargs.get("session_id") if isinstance(xargs, dict)
                  else None):
        if isinstance(value, str) and NAME_PATTERN.fullmatch(value):
            return value
    return None


def prompt_units(body: dict, endpoint: str) -> list:
    """The prompt as routing units: token ids, or characters of the text."""
    if endpoint == "completions" and isinstance(body["prompt"], list):
        return body["prompt"]
    text = body["prompt"] if endpoint == "completions" else json.dumps(body["messages"])
    return list(text)


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


@attrs.define(eq=False)
class _Metrics:
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    requests: Counter = attrs.field(init=False)
    decisions: Counter = attrs.field(init=False)
    retries: Counter = attrs.field(init=False)
    up: Gauge = attrs.field(init=False)
    inflight: Gauge = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("pd_router_requests", "Requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.decisions = Counter("pd_router_decisions", "Routing decisions by pool and reason",
                                 ["pool", "reason"], registry=r)
        self.retries = Counter("pd_router_retries", "Attempts repeated after a backend failure",
                               registry=r)
        self.up = Gauge("pd_router_instance_up", "1 while the instance is routable",
                        ["instance", "pool"], registry=r)
        self.inflight = Gauge("pd_router_instance_inflight", "Requests in flight",
                              ["instance", "pool"], registry=r)


@attrs.define(eq=False, kw_only=True)
class PDProxy:
    """The router server; build its app with `app` and serve it (see `pd_launch`)."""

    prefill_urls: Mapping[str, str]
    """Instance name -> base URL (``http://host:port``) of each prefill server."""
    decode_urls: Mapping[str, str]
    router: Any
    """`PDRouter`, `LeastLoadedRouter` or `RoundRobinRouter` over the same names."""
    max_attempts: int = 3
    health_interval_s: float = 2.0
    request_timeout_s: float = 300.0
    units_per_block: int = 64
    """Prompt characters (or token ids) per prefix key."""
    _metrics: _Metrics = attrs.field(init=False, factory=_Metrics)
    _prefill_tokens: dict[str, int] = attrs.field(init=False, factory=dict)
    _decodes: dict[str, int] = attrs.field(init=False, factory=dict)
    _ids: itertools.count = attrs.field(init=False, factory=itertools.count)
    _session: aiohttp.ClientSession | None = attrs.field(init=False, default=None)

    def app(self) -> web.Application:
        """The aiohttp application: OpenAI endpoints, ``/health``, ``/metrics``."""
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics_page)
        app.cleanup_ctx.append(self._lifecycle)
        return app

    async def _lifecycle(self, _app: web.Application):
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=5)
        # No cap on backend connections: each in-flight stream holds one for its whole life.
        self._session = aiohttp.ClientSession(timeout=timeout,
                                              connector=aiohttp.TCPConnector(limit=0))
        for pool, urls in (("prefill", self.prefill_urls), ("decode", self.decode_urls)):
            for name in urls:
                self._metrics.up.labels(name, pool).set(1)
        checker = asyncio.create_task(self._health_loop())
        yield
        checker.cancel()
        await self._session.close()

    async def check_health(self) -> None:
        """Probe every instance's ``/health`` once; mark it up or down accordingly."""
        for pool, urls in (("prefill", self.prefill_urls), ("decode", self.decode_urls)):
            for name, url in urls.items():
                try:
                    async with self._session.get(f"{url}/health",
                                                 timeout=aiohttp.ClientTimeout(total=2)) as r:
                        healthy = r.status == 200
                except _RETRYABLE:
                    healthy = False
                self._set_health(name, pool, healthy)

    def _set_health(self, name: str, pool: str, healthy: bool) -> None:
        (self.router.mark_up if healthy else self.router.mark_down)(name)
        self._metrics.up.labels(name, pool).set(int(healthy))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()

    async def _health(self, _request: web.Request) -> web.Response:
        if any(self.router.is_up(name) for name in self.decode_urls):
            return web.json_response({"status": "ok"})
        return _error(503, "no decode instance is healthy", "service_unavailable")

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._metrics.registry),
                            content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat/completions")

    async def _handle(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        kind = "completions" if endpoint == "completions" else "chat"
        if (reason := validation_error(body, kind)) is not None:
            self._metrics.requests.labels(endpoint, "invalid").inc()
            return _error(400, reason, "invalid_request_error")
        units = prompt_units(body, kind)
        blocks = [hash(tuple(units[i:i + self.units_per_block]))
                  for i in range(0, len(units) - self.units_per_block + 1, self.units_per_block)]
        keys = chain_keys(blocks)
        tokens = len(units) if isinstance(body.get("prompt"), list) else (
            len(units) // CHARS_PER_TOKEN + 1)
        response, outcome = None, "failed"
        for attempt in range(self.max_attempts):
            decision = self._route(f"pd-{next(self._ids)}", tokens, keys,
                                   request_session_id(body))
            if decision.decode is None:
                response, outcome = _error(503, "no decode instance is healthy",
                                           "service_unavailable"), "unavailable"
                break
            if attempt:
                self._metrics.retries.inc()
            try:
                response = await self._serve(request, body, endpoint, decision, tokens)
                outcome = "ok" if response.status < 400 else f"http_{response.status}"
                break
            except _Refused as refused:
                response, outcome = refused.response, f"http_{refused.response.status}"
                break
            except BackendError as failed:
                response = _error(502, f"backend failed after {attempt + 1} attempt(s): "
                                  f"{failed}", "bad_gateway")
        self._metrics.requests.labels(endpoint, outcome).inc()
        return response

    def _route(self, request_id: str, tokens: int, keys: list[int],
               session_id: str | None) -> RouteDecision:
        loads = {name: InstanceLoad(queued_prefill_tokens=self._prefill_tokens.get(name, 0))
                 for name in self.prefill_urls}
        loads.update({name: InstanceLoad(running_decodes=self._decodes.get(name, 0))
                      for name in self.decode_urls})
        decision = self.router.route(request_id, tokens, keys, loads, session_id=session_id)
        self._metrics.decisions.labels("prefill", decision.prefill_reason.value).inc()
        self._metrics.decisions.labels("decode", decision.decode_reason.value).inc()
        return decision

    def _fail(self, name: str, pool: str, reason: str) -> BackendError:
        self._set_health(name, pool, False)
        return BackendError(f"{pool} instance {name}: {reason}")

    async def _prefill(self, body: dict, endpoint: str, name: str, tokens: int) -> dict | None:
        """Run the prompt on ``name`` with one output token; its ``kv_transfer_params``."""
        request = prefill_request(body)
        self._prefill_tokens[name] = self._prefill_tokens.get(name, 0) + tokens
        self._metrics.inflight.labels(name, "prefill").inc()
        try:
            async with self._session.post(f"{self.prefill_urls[name]}/v1/{endpoint}",
                                          json=request) as answer:
                if answer.status >= 500:
                    raise self._fail(name, "prefill", f"HTTP {answer.status}")
                if answer.status != 200:
                    raise _Refused(answer.status, await answer.read(), answer.content_type)
                return (await answer.json(content_type=None)).get("kv_transfer_params")
        except _RETRYABLE as error:
            raise self._fail(name, "prefill", type(error).__name__) from error
        finally:
            self._prefill_tokens[name] -= tokens
            self._metrics.inflight.labels(name, "prefill").dec()

    async def _serve(self, request: web.Request, body: dict, endpoint: str,
                     decision: RouteDecision, tokens: int) -> web.StreamResponse:
        decode_body = dict(body)
        if decision.prefill is not None:
            params = await self._prefill(body, endpoint, decision.prefill, tokens)
            if params:
                decode_body["kv_transfer_params"] = params
        name = decision.decode
        self._decodes[name] = self._decodes.get(name, 0) + 1
        self._metrics.inflight.labels(name, "decode").inc()
        try:
            return await self._relay(request, decode_body, endpoint, name)
        finally:
            self._decodes[name] -= 1
            self._metrics.inflight.labels(name, "decode").dec()

    async def _relay(self, request: web.Request, body: dict, endpoint: str,
                     name: str) -> web.StreamResponse:
        """Send ``body`` to decode instance ``name`` and relay its answer to the client."""
        try:
            answer = await self._session.post(f"{self.decode_urls[name]}/v1/{endpoint}",
                                              json=body)
        except _RETRYABLE as error:
            raise self._fail(name, "decode", type(error).__name__) from error
        async with answer:
            if answer.status >= 500:
                raise self._fail(name, "decode", f"HTTP {answer.status}")
            if not body.get("stream") or answer.status != 200:
                try:
                    payload = await answer.read()
                except _RETRYABLE as error:
                    raise self._fail(name, "decode", type(error).__name__) from error
                return web.Response(body=payload, status=answer.status,
                                    content_type=answer.content_type)
            stream = web.StreamResponse(status=answer.status,
                                        headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            try:
                async for chunk in answer.content.iter_any():
                    await stream.write(chunk)
            except _RETRYABLE as error:
                self._fail(name, "decode", type(error).__name__)
                event = {"error": {"message": f"decode instance {name} failed mid-stream",
                                   "type": "bad_gateway", "code": 502}}
                await stream.write(f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())
            await stream.write_eof()
            return stream
