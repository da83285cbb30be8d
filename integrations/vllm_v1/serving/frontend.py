"""The frontend gate in the API server: a request whose wait before the engine alone breaks its
class's TTFT is answered 503 at once (`FrontendStage`, over `policies.FrontendGate`).

Active with the ``slo`` preset only. `integrations.vllm_v1.serving.middleware.PolicyMiddleware`
opens a `Visit` for each engine-bound request as it enters: the request is in the frontend's
pre-engine stage until vLLM sends its response's first message (for a stream, once vLLM has
read and tokenized it) or the engine first says something of its ticket over the channel
(admitted or rejected, `integrations.vllm_v1.serving.rejection_channel`), whichever comes
first. Once the request
is checked, the gate predicts its wait behind the requests that were in the stage when it
entered; if that wait exceeds the TTFT target of its class (the body's ``slo_class`` when
declared, else its tenant's class, else the tightest declared class), it is answered 503,
reason ``frontend_busy``, ``Retry-After`` the predicted wait rounded up (at least 1 s) and
``x-slo-class`` the class, without reaching vLLM.

Metrics (this API server's process, on ``/metrics``): ``policies:frontend_gate_rejections_total
{slo_class}``, ``policies:frontend_gate_admissions_total``, ``policies:frontend_queue_s`` (the
predicted wait of the latest request), ``policies:frontend_stage_requests`` (requests in the
stage) and ``policies:frontend_service_rate`` (the learned completions per busy second; 0
until measured).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.asgi import Send, replay, send_error
from integrations.vllm_v1.serving.http_status import json_or_none, with_judged_headers
from integrations.vllm_v1.serving.http_validation import Forward
from integrations.vllm_v1.serving.rejection_channel import Judged
from integrations.vllm_v1.serving.routes import EngineRoute
from policies.frontend_gate import FrontendGate


@attrs.define(eq=False, kw_only=True)
class FrontendStage:
    """The gate over the declared classes' TTFT targets; `visit` per request."""

    gate: FrontendGate
    ttft_s: Mapping[str, float]
    """Class -> its TTFT target."""
    tenants: Mapping[str, str]
    """Tenant -> its requests' class when they name none."""
    clock: Callable[[], float] = time.monotonic
    metrics: Any = None
    """`_FrontendMetrics`, or None (no metrics)."""

    @classmethod
    def from_spec(cls, spec: SLOSpec | None, *, metrics: bool = True) -> FrontendStage | None:
        """The stage of an ``slo`` declaration (None: the preset is not served)."""
        if spec is None:
            return None
        return cls(gate=FrontendGate(), ttft_s={name: target.ttft_s
                                                for name, target in spec.classes.items()},
                   tenants=dict(spec.tenants), metrics=_metrics() if metrics else None)

    @property
    def tightest(self) -> str:
        """The declared class with the shortest TTFT target."""
        return min(self.ttft_s, key=lambda name: (self.ttft_s[name], name))

    def visit(self) -> Visit:
        """A request enters the stage."""
        visit = Visit(stage=self, ahead=self.gate.enter(self.clock()))
        self.refresh_metrics()
        return visit

    def class_of(self, payload: object, route: EngineRoute) -> str:
        """The class a checked request body is judged in for the gate."""
        xargs = payload if route.reads_xargs else None
        for key in route.xargs_path:
            xargs = xargs.get(key) if isinstance(xargs, dict) else None
        named, tenant = (xargs.get("slo_class"), xargs.get("tenant")) if isinstance(
            xargs, dict) else (None, None)
        if isinstance(named, str) and named in self.ttft_s:
            return named
        tenant_class = self.tenants.get(tenant) if isinstance(tenant, str) else None
        return tenant_class if tenant_class in self.ttft_s else self.tightest

    def refresh_metrics(self) -> None:
        """Set the stage's gauges (requests in it, the learned rate)."""
        if self.metrics is not None:
            stats = self.gate.stats()
            self.metrics.in_stage.set(stats.in_stage)
            self.metrics.rate.set(stats.rate_per_s or 0.0)


@attrs.define(eq=False)
class Visit:
    """One request in the stage, from entering to leaving (once)."""

    stage: FrontendStage
    ahead: int
    """Requests in the stage when it entered."""
    served: bool = False
    left: bool = False

    def leave(self) -> None:
        """The request left the stage (idempotent): a completion if it was admitted."""
        if not self.left:
            self.left = True
            self.stage.gate.leave(self.stage.clock(), served=self.served)
            self.stage.refresh_metrics()

    async def admit(self, forward: Forward, route: EngineRoute, send: Send) -> Forward | None:
        """The checked request to pass on, or None when the gate answered it with 503."""
        stage = self.stage
        now = stage.clock()
        cls = stage.tightest
        if stage.gate.wait_s(self.ahead, now) > stage.ttft_s[cls]:  # its class decides
            message = await forward.receive()
            body = message.get("body", b"")
            forward = attrs.evolve(forward, receive=replay(body, forward.receive))
            cls = stage.class_of(json_or_none(body), route)
        decision = stage.gate.decide(self.ahead, stage.ttft_s[cls], now)
        metrics = stage.metrics
        if metrics is not None:
            metrics.queue.set(stage.gate.stats().last_wait_s)
        if decision.admitted:
            self.served = True
            if metrics is not None:
                metrics.admissions.inc()
            return forward
        if metrics is not None:
            metrics.rejections.labels(slo_class=cls).inc()
        wait = decision.retry_after_s or 0.0
        rejection = Rejection(reason=decision.reason, retry_after_s=wait, detail=(
            f"{cls}: predicted wait before the engine {wait:.2f} s exceeds the class's TTFT "
            f"target {stage.ttft_s[cls]:g} s"))
        await send_error(with_judged_headers(send, Judged(cls)), rejection.http_status,
                         rejection.message, anthropic=route.anthropic_errors,
                         retry_after=rejection.retry_after_header)
        return None


@attrs.frozen
class _FrontendMetrics:
    rejections: Any
    admissions: Any
    queue: Any
    in_stage: Any
    rate: Any


@functools.cache
def _metrics() -> _FrontendMetrics:
    """The gate's Prometheus metrics, once per process (vLLM's ``/metrics`` shows the default
    registry, or every process's values in multiprocess mode)."""
    from prometheus_client import Counter, Gauge

    def gauge(name: str, text: str) -> Any:
        return Gauge(name, text, multiprocess_mode="mostrecent")

    return _FrontendMetrics(
        rejections=Counter("policies:frontend_gate_rejections", "Requests the frontend gate "
                           "answered 503 (frontend_busy), by SLO class", ["slo_class"]),
        admissions=Counter("policies:frontend_gate_admissions",
                           "Requests the frontend gate let through"),
        queue=gauge("policies:frontend_queue_s", "Predicted wait before the engine of the "
                    "latest request (seconds)"),
        in_stage=gauge("policies:frontend_stage_requests", "Requests between the API "
                       "server's entry and the engine"),
        rate=gauge("policies:frontend_service_rate", "Learned completions per busy second of "
                   "the API server's pre-engine stage (0 until measured)"))
