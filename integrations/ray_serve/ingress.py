"""`OpenAIIngress`: the OpenAI-compatible front of the Ray Serve app (a FastAPI ingress).

It serves ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (the routers' decisions and every
request's outcome, `integrations.ray_serve.metrics`) and ``GET /metrics/targets`` (the
engine replicas' metrics endpoints, Prometheus HTTP-SD form). Per request it:

1. computes the prompt's `RoutingHint` (`integrations.ray_serve.prefix`), which the engine
   deployment's request router reads (`integrations.ray_serve.router`);
2. with a prefill deployment (disaggregated serving), sends the prompt there first with
   ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true, ...}``, then the
   original request, plus the ``kv_transfer_params`` the prefill answer returned, to the
   decode deployment (vLLM's KV-connector protocol; `ExampleConnector` on CPU keys KV by
   the prompt and returns none);
3. relays the engine's answer: status, body, stream; with a cluster router
   (`integrations.ray_serve.cluster_router`), a refusal by the router is answered 503 with
   ``Retry-After`` and the reason (``x-rejected-by: router``), and a replica's 503 is sent
   once more through the router, which may place it on another replica with room
   (``retry_rejections``), before the client sees it.

Failover (what a client sees when a replica dies):

- before its first byte, a request is retried on another replica, at most
  ``max_attempts`` times in all; when every attempt failed, the answer is HTTP 502 with an
  OpenAI-style error naming the replica failure; a failed prefill instead lets the
  decode replica compute the prompt itself;
- after its first byte (a stream under way), the stream ends with an SSE ``error`` event
  (``{"error": {"type": "replica_failed", ...}}``) and ``data: [DONE]``;
- nothing is silently lost: every request offered ends ``completed``, ``rejected`` (with
  a reason) or ``cancelled`` (the client went away), counted in
  ``policies:ingress_requests_total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError, RayError
from ray.serve.handle import DeploymentHandle

from integrations.ray_serve import metrics
from integrations.ray_serve.engine import EngineRequest, ReplyHead
from integrations.ray_serve.prefix import PromptKeys, RoutingHint
from integrations.vllm_v1.pd.proxy import prefill_request, validation_error
from integrations.vllm_v1.rejection import Rejection

logger = logging.getLogger(__name__)

_DROPPED_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding",
                              "keep-alive", "upgrade", "accept-encoding"})
_RETRY_STATUSES = frozenset({500, 502, 504})
"""Engine answers retried elsewhere (the engine failed; a 503/429 is a decision, kept)."""


@attrs.frozen(kw_only=True)
class IngressConfig:
    """What the ingress needs to know of the app."""

    model: str
    """The model (its tokenizer computes prefix keys)."""
    block_size_tokens: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    """Tokens per prefix key: the engines' KV block size."""
    max_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    """Tries per request (per pool) when replicas die before answering."""
    engine_label: str = "engine"
    """The engine (or decode) deployment's name, for metrics."""
    prefill_label: str = "prefill"
    targets_dir: str | None = None
    """The engines' `TargetsDirectory` (None: ``/metrics/targets`` lists nothing)."""
    retry_rejections: bool = False
    """Send a request an engine replica answered 503 once more through the request router,
    naming that replica (a cluster router's ``retry``: `integrations.ray_serve.cluster_router`);
    the client gets the first 503 when the router places it nowhere."""


@attrs.define(eq=False)
class _Attempt:
    """An engine answer under way: its head and the rest of its stream."""

    head: ReplyHead
    rest: Any
    attempts: int


class _Drained:
    """The rest of an answer already read into its head: nothing more to stream."""

    def __aiter__(self) -> _Drained:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration

    def cancel(self) -> None:
        """Nothing is under way."""


class _Failed(Exception):
    """Every attempt's replica failed before answering (or the engine call itself failed)."""

    def __init__(self, label: str, attempts: int, error: BaseException | None,
                 reason: str = "replica_failed") -> None:
        super().__init__(f"{label}: {attempts} attempt(s) failed: {_describe(error)}")
        self.reason = reason


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "no answer"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status)


def rejection_reason(status: int, body: bytes) -> str:
    """The ingress metrics' reason for an engine's error answer."""
    try:
        message = json.loads(body).get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        message = ""
    rejection = Rejection.from_message(message) if isinstance(message, str) else None
    if rejection is not None:
        return rejection.reason
    if status in (400, 404, 422):
        return "invalid_request"
    if status >= 500 and status != 503:
        return "engine_error"
    return f"http_{status}"


def _forwarded(request: Request) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in request.headers.items() if k.lower() not in _DROPPED_HEADERS)


# Everything the routes use is defined above: Ray Serve freezes the app (and the globals its
# routes see) when the class is decorated.
app = FastAPI(title="llm-serving-policies on Ray Serve")


@serve.ingress(app)
class OpenAIIngress:
    """The ingress deployment: ``OpenAIIngress.bind(config, engine_handle, prefill_handle)``."""

    def __init__(self, config: IngressConfig, engine: DeploymentHandle,
                 prefill: DeploymentHandle | None = None) -> None:
        self.config = config
        self.engine = engine
        self.prefill = prefill
        self.keys = PromptKeys.for_model(config.model, config.block_size_tokens)
        labels = (config.engine_label,) + ((config.prefill_label,) if prefill else ())
        metrics.declare(labels)

    # -- routes ---------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI completions, streamed or not."""
        return await self._serve(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions, streamed or not."""
        return await self._serve(request, "chat/completions")

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        """The served model, as an engine replica lists it."""
        try:
            attempt = await self._first(self.engine, EngineRequest(
                method="GET", path="/v1/models", headers=_forwarded(request)),
                self.config.engine_label)
        except _Failed as failed:
            return _error(502, str(failed), failed.reason)
        body = attempt.head.first_chunk + b"".join([c async for c in attempt.rest])
        return Response(body, status_code=attempt.head.status,
                        media_type=attempt.head.content_type)

    @app.get("/health")
    async def health(self) -> Response:
        """200 while this ingress runs (Ray Serve health-checks the engines itself)."""
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_page(self) -> Response:
        """The ingress's and its routers' metrics (Prometheus text)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics/targets")
    async def metrics_targets(self) -> Response:
        """The engine replicas' metrics endpoints (Prometheus ``http_sd_configs`` JSON)."""
        if self.config.targets_dir is None:
            return JSONResponse([])
        return JSONResponse(metrics.TargetsDirectory(self.config.targets_dir).targets())

    # -- serving ----------------------------------------------------------------------
    async def _serve(self, request: Request, endpoint: str) -> Response:
        arrived_s = time.time()
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        kind = "completions" if endpoint == "completions" else "chat"
        problem = ("the request body must be a JSON object" if not isinstance(body, dict)
                   else validation_error(body, kind) if self.prefill is not None else None)
        if problem is not None:
            self._count(endpoint, "rejected", "invalid_request")
            return _error(400, problem, "invalid_request_error")
        hint = self.keys.hint(endpoint, body)
        headers = _forwarded(request)
        try:
            prefilled_by = await self._prefill(endpoint, body, headers, hint)
            if isinstance(prefilled_by, Response):
                return prefilled_by
            attempt = await self._engine_answer(EngineRequest(
                path=f"/v1/{endpoint}", body=json.dumps(body).encode(), headers=headers,
                hint=hint, request_id=uuid.uuid4().hex, arrival_s=arrived_s))
            return await self._relay(endpoint, body, attempt, prefilled_by)
        except _Failed as failed:
            self._count(endpoint, "rejected", failed.reason)
            return _error(502, str(failed), failed.reason)
        except asyncio.CancelledError:  # the client went away before its answer started
            self._count(endpoint, "cancelled")
            raise

    async def _prefill(self, endpoint: str, body: dict[str, Any],
                       headers: tuple[tuple[str, str], ...],
                       hint: RoutingHint) -> str | Response | None:
        """Prefill on the prefill deployment (if any); its replica, or a client-error answer.

        The decode request gets the prefill answer's ``kv_transfer_params`` (``body`` is
        updated in place). A prefill that fails leaves the prompt to the decode replica.
        """
        if self.prefill is None:
            return None
        try:
            attempt = await self._first(self.prefill, EngineRequest(
                path=f"/v1/{endpoint}", body=json.dumps(prefill_request(body)).encode(),
                headers=headers,
                hint=hint), self.config.prefill_label)
        except _Failed as failed:
            logger.warning("prefill failed, the decode replica computes the prompt: %s", failed)
            return None
        answer = attempt.head.first_chunk + b"".join([c async for c in attempt.rest])
        if 400 <= attempt.head.status < 500:
            self._count(endpoint, "rejected", rejection_reason(attempt.head.status, answer))
            return Response(answer, status_code=attempt.head.status,
                            media_type=attempt.head.content_type)
        if attempt.head.status != 200:
            return None
        try:
            params = json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if params:
            body["kv_transfer_params"] = params
        return attempt.head.replica

    async def _engine_answer(self, request: EngineRequest) -> _Attempt:
        """The engine deployment's answer; with ``retry_rejections``, a replica's 503 is sent
        once more through the router (which may place it on another replica) before the
        client sees it."""
        label = self.config.engine_label
        attempt = await self._first(self.engine, request, label)
        head = attempt.head
        if not self.config.retry_rejections or head.status != 503 or \
                head.router_rejection is not None:
            return attempt
        rest = b"".join([c async for c in attempt.rest])
        first = _Attempt(attrs.evolve(head, first_chunk=head.first_chunk + rest), _Drained(),
                         attempt.attempts)
        again = await self._first(self.engine, attrs.evolve(request, rejected_by=head.replica),
                                  label)
        placed = again.head.router_rejection is None
        metrics.INGRESS_REJECTION_RETRIES.labels(label, "placed" if placed else "passed_on").inc()
        if not placed:
            return first
        again.attempts += attempt.attempts
        return again

    async def _first(self, handle: DeploymentHandle, request: EngineRequest,
                     label: str) -> _Attempt:
        """Send ``request`` until a replica answers (at most ``max_attempts`` tries)."""
        error: BaseException | None = None
        for attempt in range(1, self.config.max_attempts + 1):
            if attempt > 1:
                metrics.INGRESS_RETRIES.labels(label).inc()
            stream = handle.options(stream=True).generate.remote(request)
            try:
                head = await stream.__anext__()
            except asyncio.CancelledError:
                stream.cancel()
                raise
            except StopAsyncIteration:
                error = None
                continue
            except RayActorError as died:  # the replica died or is unreachable
                error = died
                continue
            except RayError as failed:  # the replica's code raised: not a replica failure
                raise _Failed(label, attempt, failed, "engine_error") from failed
            if head.status in _RETRY_STATUSES and attempt < self.config.max_attempts:
                rest = b"".join([c async for c in stream])
                error = RuntimeError(f"replica {head.replica} answered HTTP {head.status}: "
                                     f"{(head.first_chunk + rest)[:200]!r}")
                continue
            return _Attempt(head, stream, attempt)
        raise _Failed(label, self.config.max_attempts, error)

    async def _relay(self, endpoint: str, body: Mapping[str, Any], attempt: _Attempt,
                     prefilled_by: str | None) -> Response:
        head = attempt.head
        headers = {"x-served-by": head.replica, "x-served-by-actor": head.actor,
                   "x-served-on-node": head.node, "x-attempts": str(attempt.attempts)}
        if prefilled_by:
            headers["x-prefilled-by"] = prefilled_by
        if head.retry_after is not None:
            headers["retry-after"] = head.retry_after
        if head.router_rejection is not None:  # the router's refusal: no replica served it
            headers = {"x-rejected-by": "router", "retry-after": head.retry_after or "1"}
            self._count(endpoint, "rejected", head.router_rejection.reason)
            return Response(head.first_chunk, status_code=503, media_type=head.content_type,
                            headers=headers)
        if head.status != 200 or not body.get("stream") or \
                not head.content_type.startswith("text/event-stream"):
            try:
                rest = b"".join([c async for c in attempt.rest])
            except asyncio.CancelledError:
                attempt.rest.cancel()
                raise
            except RayError as error:  # died after its head: nothing reached the client yet
                self._count(endpoint, "rejected", "replica_failed")
                return _error(502, f"replica {head.replica} failed: {_describe(error)}",
                              "replica_failed")
            content = head.first_chunk + rest
            if head.status == 200:
                self._count(endpoint, "completed")
            else:
                self._count(endpoint, "rejected", rejection_reason(head.status, content))
            return Response(content, status_code=head.status, media_type=head.content_type,
                            headers=headers)
        return StreamingResponse(self._stream(endpoint, attempt), status_code=200,
                                 media_type="text/event-stream", headers=headers)

    async def _stream(self, endpoint: str, attempt: _Attempt) -> AsyncIterator[bytes]:
        outcome, reason = "cancelled", None
        try:
            yield attempt.head.first_chunk
            async for chunk in attempt.rest:
                yield chunk
            outcome = "completed"
        except RayError as error:
            outcome, reason = "rejected", "replica_failed"
            event = {"error": {"message": f"replica {attempt.head.replica} failed mid-stream: "
                                          f"{_describe(error)}",
                               "type": "replica_failed", "code": 502}}
            yield f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
        finally:
            if outcome == "cancelled":
                attempt.rest.cancel()
            self._count(endpoint, outcome, reason)

    def _count(self, endpoint: str, outcome: str, reason: str | None = None) -> None:
        metrics.INGRESS_REQUESTS.labels(endpoint, outcome).inc()
        if reason is not None:
            metrics.INGRESS_REJECTIONS.labels(reason).inc()
