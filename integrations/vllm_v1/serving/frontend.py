"""The API server's door with the ``slo`` preset (`FrontendStage`): a request is answered 503 at
once when the wait before the engine alone breaks its class's TTFT (`policies.FrontendGate`), or
when the requests in flight ahead of it reach the limit its class learned from lateness
(`policies.ClassConcurrencyLimits`).

Active with the ``slo`` preset only. `integrations.vllm_v1.serving.middleware.PolicyMiddleware`
opens a `Visit` for each engine-bound request as it enters: the request is in the frontend's
pre-engine stage until vLLM sends its response's first message (for a stream, once vLLM has
read and tokenized it) or the engine first says something of its ticket over the channel
(admitted or rejected, `integrations.vllm_v1.serving.rejection_channel`), whichever comes
first, and in flight until its response ends. Once the request is checked, its class is the
body's ``slo_class`` when declared, else its tenant's class, else the tightest declared class.

- **Gate**: the gate predicts its wait behind the requests that were in the stage when it
  entered; over the class's TTFT target it is answered 503, reason ``frontend_busy``,
  ``Retry-After`` the predicted wait.
- **Limit**: each TTFT target has its own limit on the requests in flight of its classes and
  of every tighter class (served ahead of them: the engine serves the earliest first-token
  deadline first). When those reach the limit of the request's class (and, where the
  declaration has ``fairness``, its tenant holds its weighted share of the places or more), it
  is answered 503, reason ``concurrency_limit``, ``Retry-After`` when a place frees up on
  average. A stream's first token is reported late when it left after `LATE_SHARE` of its
  class's TTFT target, and its end late when its time per output token was over that share
  of the TPOT target. An engine refusal is neither: the engine's admission at work says
  nothing of whether admitted requests are served on time. Each report goes to the limit of
  the class the request was judged in; a limit falls on lateness and grows back while on time
  (AIMD), so a tight class's lateness leaves the looser classes' limits alone.
  Non-streaming responses report nothing else; they hold a place while in flight.

Both answers come without reaching vLLM and carry ``x-slo-class``.

Metrics (this API server's process, on ``/metrics``): ``policies:frontend_gate_rejections_total
{slo_class}``, ``policies:frontend_gate_admissions_total``, ``policies:frontend_queue_s`` (the
predicted wait of the latest request), ``policies:frontend_stage_requests`` (requests in the
stage), ``policies:frontend_service_rate`` (the learned completions per busy second; 0 until
measured), ``policies:frontend_limit_rejections_total{slo_class}``,
``policies:frontend_concurrency_limit{slo_class}`` (each class's learned limit),
``policies:frontend_in_flight`` (every class)
and ``policies:frontend_late_reports_total{what}`` (``ttft`` or ``tpot``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.serving.asgi import Send, send_error
from integrations.vllm_v1.serving.http_status import with_judged_headers
from integrations.vllm_v1.serving.http_validation import Forward
from integrations.vllm_v1.serving.rejection_channel import Judged
from integrations.vllm_v1.serving.routes import EngineRoute
from policies.admission.concurrency_limit import ClassConcurrencyLimits, ConcurrencyLimit
from policies.admission.frontend_gate import FrontendGate

LATE_SHARE = 0.8
"""A stream counts as late for the concurrency limit past this share of its class's target:
the limit falls before requests miss, not after."""


@attrs.define(eq=False, kw_only=True)
class FrontendStage:
    """The gate over the declared classes' TTFT targets; `visit` per request."""

    gate: FrontendGate
    limits: ClassConcurrencyLimits
    ttft_s: Mapping[str, float]
    """Class -> its TTFT target."""
    tpot_s: Mapping[str, float]
    """Class -> its TPOT target."""
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
        classes = spec.classes.items()
        weights = None if spec.fairness_weights is None else dict(spec.fairness_weights)
        ttft_s = {name: target.ttft_s for name, target in classes}
        limits = ClassConcurrencyLimits(ttft_s=ttft_s, limit=functools.partial(
            ConcurrencyLimit, weights=weights))
        return cls(gate=FrontendGate(), limits=limits, ttft_s=ttft_s,
                   tpot_s={name: target.tpot_s for name, target in classes},
                   tenants=dict(spec.tenants), metrics=_metrics() if metrics else None)

    @property
    def tightest(self) -> str:
        """The declared class with the shortest TTFT target."""
        return min(self.ttft_s, key=lambda name: (self.ttft_s[name], name))

    def visit(self) -> Visit:
        """A request enters the stage."""
        now = self.clock()
        visit = Visit(stage=self, ahead=self.gate.enter(now), entered_s=now)
        self.refresh_metrics()
        return visit

    def class_and_tenant(self, payload: object, route: EngineRoute) -> tuple[str, str]:
        """The class a checked request body is judged in at the door, and its tenant ("":
        none)."""
        xargs = payload if route.reads_xargs else None
        for key in route.xargs_path:
            xargs = xargs.get(key) if isinstance(xargs, dict) else None
        named, tenant = (xargs.get("slo_class"), xargs.get("tenant")) if isinstance(
            xargs, dict) else (None, None)
        tenant = tenant if isinstance(tenant, str) else ""
        if isinstance(named, str) and named in self.ttft_s:
            return named, tenant
        tenant_class = self.tenants.get(tenant)
        return (tenant_class if tenant_class in self.ttft_s else self.tightest), tenant

    def refresh_metrics(self) -> None:
        """Set the stage's gauges (requests in it, the learned rate, the limit)."""
        if self.metrics is not None:
            stats = self.gate.stats()
            self.metrics.in_stage.set(stats.in_stage)
            self.metrics.rate.set(stats.rate_per_s or 0.0)
            for name, limit in self.limits.limits.items():
                self.metrics.limit.labels(slo_class=name).set(limit.limit)
            self.metrics.in_flight.set(self.limits.in_flight)

    def report(self, what: str, slo_class: str, *, late: bool, entered_s: float) -> None:
        """A request of ``slo_class``: its first token (``what="ttft"``) or stream (``"tpot"``)
        was late or not."""
        self.limits.report(slo_class, late=late, entered_s=entered_s, now=self.clock())
        if late and self.metrics is not None:
            self.metrics.late.labels(what=what).inc()
        self.refresh_metrics()


@attrs.define(eq=False)
class Visit:
    """One request at the door, from entering to its response's end (a `StreamListener`)."""

    stage: FrontendStage
    ahead: int
    """Requests in the stage when it entered."""
    entered_s: float
    """When it entered (the stage's clock)."""
    slo_class: str | None = None
    """The class it was checked in (None until `admit`)."""
    tenant: str = ""
    served: bool = False
    left: bool = False
    place: str | None = None
    """The class whose limit admitted it, while it holds its place (until `end`)."""

    def leave(self) -> None:
        """The request left the stage (idempotent): a completion if it was admitted."""
        if self._left_stage():
            self.stage.refresh_metrics()

    def end(self) -> None:
        """The response ended (idempotent): the request leaves the stage and its place; the
        gauges are set once."""
        changed = self._left_stage()
        if self.place is not None:
            self.stage.limits.release(self.place, self.stage.clock() - self.entered_s,
                                      self.tenant)
            self.place = None
            changed = True
        if changed:
            self.stage.refresh_metrics()

    def _left_stage(self) -> bool:
        """Leave the gate unless it left already; whether it did now."""
        if self.left:
            return False
        self.left = True
        self.stage.gate.leave(self.stage.clock(), served=self.served)
        return True

    def first_token(self, sent_s: float) -> None:
        stage = self.stage
        if self.slo_class is not None:
            ttft = stage.clock() - self.entered_s
            stage.report("ttft", self.slo_class,
                         late=ttft > LATE_SHARE * stage.ttft_s[self.slo_class],
                         entered_s=self.entered_s)

    def stream_end(self, first_s: float, last_s: float, chunks: int) -> None:
        stage = self.stage
        if self.slo_class is not None and chunks > 1:
            tpot = (last_s - first_s) / (chunks - 1)
            stage.report("tpot", self.slo_class,
                         late=tpot > LATE_SHARE * stage.tpot_s[self.slo_class],
                         entered_s=self.entered_s)

    def judged(self, judged: Judged) -> None:
        """A request the engine served in another class (demoted) is judged by that class's
        targets from now on."""
        if judged.slo_class in self.stage.ttft_s:
            self.slo_class = judged.slo_class

    async def admit(self, forward: Forward, route: EngineRoute, send: Send) -> Forward | None:
        """The checked request to pass on, or None when the door answered it with 503."""
        stage = self.stage
        now = stage.clock()
        self.slo_class, self.tenant = stage.class_and_tenant(forward.payload, route)
        cls = self.slo_class
        decision = stage.gate.decide(self.ahead, stage.ttft_s[cls], now)
        metrics = stage.metrics
        if metrics is not None:
            metrics.queue.set(stage.gate.stats().last_wait_s)
        if not decision.admitted:
            if metrics is not None:
                metrics.rejections.labels(slo_class=cls).inc()
            wait = decision.retry_after_s or 0.0
            await _refuse(send, route, cls, decision.reason, wait, (
                f"predicted wait before the engine {wait:.2f} s exceeds the class's TTFT "
                f"target {stage.ttft_s[cls]:g} s"))
            return None
        self.served = True
        if metrics is not None:
            metrics.admissions.inc()
        limit = stage.limits.limits[cls]
        in_flight = limit.in_flight
        decision = stage.limits.acquire(cls, self.tenant)
        if not decision.admitted:
            if metrics is not None:
                metrics.limit_rejections.labels(slo_class=cls).inc()
            await _refuse(send, route, cls, decision.reason, decision.retry_after_s or 0.0, (
                f"{in_flight} requests in flight ahead of it reach the class's concurrency "
                f"limit learned from their lateness ({limit.limit})"))
            return None
        self.place = cls
        stage.refresh_metrics()
        return forward


async def _refuse(send: Send, route: EngineRoute, cls: str, reason: str, retry_after_s: float,
                  why: str) -> None:
    """Answer 503 at the door: ``reason``, ``Retry-After``, the class judged in."""
    rejection = Rejection(reason=reason, retry_after_s=retry_after_s, detail=f"{cls}: {why}")
    await send_error(with_judged_headers(send, Judged(cls)), rejection.http_status,
                     rejection.message, anthropic=route.anthropic_errors,
                     retry_after=rejection.retry_after_header)


@attrs.frozen
class _FrontendMetrics:
    rejections: Any
    admissions: Any
    queue: Any
    in_stage: Any
    rate: Any
    limit_rejections: Any
    limit: Any
    in_flight: Any
    late: Any


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
                   "the API server's pre-engine stage (0 until measured)"),
        limit_rejections=Counter("policies:frontend_limit_rejections", "Requests answered 503 "
                                 "(concurrency_limit) at the learned limit, by SLO class",
                                 ["slo_class"]),
        limit=Gauge("policies:frontend_concurrency_limit", "Requests of an SLO class and the "
                    "tighter classes the API server takes in flight at once, learned from the "
                    "class's lateness", ["slo_class"], multiprocess_mode="mostrecent"),
        in_flight=gauge("policies:frontend_in_flight", "Requests admitted at the door whose "
                        "response has not ended"),
        late=Counter("policies:frontend_late_reports", "Requests late for the concurrency limit: "
                     "a stream's first token (ttft) or time per output token (tpot)", ["what"]))
