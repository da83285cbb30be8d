"""`VLLMEngine`: one vLLM engine running a `Pipeline`, as a Ray Serve deployment's replica.

Each replica starts vLLM in-process the way ``vllm serve`` does, from ``vllm serve``
flags: ``AsyncLLM.from_engine_args`` (the engine core and its worker run in child
processes, vLLM's default multiprocessing executor; vLLM's Ray executor refuses the
CPU) and vLLM's own OpenAI application over it, with this project's scheduler,
pipeline and HTTP middlewares (validation, 429/503 mapping) named in the flags as
for any vLLM server (`integrations.vllm_v1.serving.server.server_args`). Requests
reach that application in-process (`integrations.ray_serve.asgi`), so every answer,
error and stream is vLLM's own.

``generate`` holds back the answer until its first body bytes exist and sends them
with the status (`ReplyHead`): a replica that dies before then has sent nothing, and
the ingress can retry the request elsewhere. ``record_routing_stats`` reports the
replica's load to Ray Serve for the request router. Each replica serves its
Prometheus metrics (vLLM's ``vllm:*`` and the pipeline's ``policies:*``, which the
engine-core process writes to a per-replica multiprocess directory) on a port of its
own, listed in a `TargetsDirectory` for Prometheus.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs

from integrations.ray_serve.asgi import ResponseStart, call_asgi
from integrations.ray_serve.metrics import TargetsDirectory
from integrations.ray_serve.prefix import RoutingHint
from integrations.vllm_v1.config.spec import resolve_pipeline
from integrations.vllm_v1.metrics import MULTIPROC_ENV
from integrations.vllm_v1.pipeline import Pipeline

logger = logging.getLogger(__name__)

LOAD_GAUGES = {"vllm:num_requests_running": "running_requests",
               "vllm:num_requests_waiting": "waiting_requests",
               "vllm:kv_cache_usage_perc": "kv_usage"}
"""vLLM's gauges read for the routing stats, and the stats key each one fills."""
POLICY_GAUGES = {"policies:slo_headroom": "ttft_headroom",
                 "policies:slo_tpot_headroom": "tpot_headroom",
                 "policies:slo_tpot_bound_seconds": "tpot_bound_s"}
"""The SLO admission's gauges read for the routing stats (`integrations.vllm_v1.slo`)."""
STEP_MODEL_GAUGE = "policies:step_model_coefficient"
"""The learned step model's coefficients, by ``term``."""


@attrs.frozen(kw_only=True)
class EngineConfig:
    """What one engine deployment runs: ``vllm serve MODEL`` flags plus a pipeline."""

    model: str
    pipeline: Pipeline | str | Mapping[str, Any] | None = None
    """A `Pipeline`, or any form ``--additional-config`` accepts (preset name,
    ``pkg.mod:attr``, a mapping, a file; `integrations.vllm_v1.config.spec`); None runs
    vLLM's stock scheduler."""
    vllm_args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Further ``vllm serve`` flags (``--dtype``, ``--block-size``, ``--kv-transfer-config``...)."""
    role: str = "engine"
    """Label of this deployment's replicas in metrics targets (``engine``, ``prefill``, ...)."""
    metrics_host: str = "127.0.0.1"
    """Address each replica's metrics server binds; ``0.0.0.0`` (for a Prometheus on another
    machine) registers the node's address as the target."""
    targets_dir: str | None = None
    """The `TargetsDirectory` replicas register their metrics endpoint in (None: none)."""

    @vllm_args.validator
    def _check_args(self, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
        for flag in ("--model", "--scheduler-cls", "--host", "--port"):
            if flag in value:
                raise ValueError(f"EngineConfig.{attribute.name} must not set {flag}: "
                                 "it comes from model and pipeline")
        if not all(isinstance(arg, str) for arg in value):
            raise ValueError(f"EngineConfig.{attribute.name} must be strings, got {value!r}")

    def serve_argv(self) -> list[str]:
        """The ``vllm serve`` arguments of this engine (no host or port: nothing listens)."""
        if self.pipeline is None:
            return ["--model", self.model, *self.vllm_args]
        from integrations.vllm_v1.serving.server import server_args

        pipeline = resolve_pipeline(self.pipeline)
        argv = server_args(pipeline, self.model, host="127.0.0.1", port=0,
                           vllm_args=self.vllm_args)
        for flag in ("--host", "--port"):
            at = argv.index(flag)
            del argv[at:at + 2]
        return argv


@attrs.frozen(kw_only=True)
class RouterRejection:
    """The request router's refusal, which the replica it reaches answers without its engine
    (Ray Serve's request router can only pick replicas; the ingress answers it with 503)."""

    reason: str
    """e.g. ``router_no_feasible``."""
    retry_after_s: float | None = None


@attrs.frozen(kw_only=True)
class EngineRequest:
    """One HTTP request for an engine's OpenAI application, with its routing hint."""

    method: str = "POST"
    path: str
    """e.g. ``/v1/completions``."""
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    hint: RoutingHint = attrs.field(factory=RoutingHint)
    request_id: str = ""
    """The client request's id at the ingress (the same for its retry)."""
    arrival_s: float = 0.0
    """When the ingress received it (wall-clock seconds)."""
    rejected_by: str | None = None
    """Set on a retry: the replica (unique id) that answered 503."""
    rejection: RouterRejection | None = None
    """Set by the request router when it refuses the request (`RouterRejection`)."""


@attrs.frozen(kw_only=True)
class ReplyHead:
    """The start of an engine's answer: status, content type, where it ran, first bytes."""

    status: int
    content_type: str
    first_chunk: bytes
    """The answer's first body bytes (a whole non-streamed answer, or the first events)."""
    replica: str
    """The replica's unique id in its deployment."""
    actor: str
    """The replica's Ray actor name (``ray.get_actor(actor, namespace="serve")``)."""
    node: str
    """The Ray node id it runs on."""
    retry_after: str | None = None
    """The answer's ``Retry-After`` header, if any."""
    router_rejection: RouterRejection | None = None
    """Set when the answer is the request router's refusal, not the engine's."""


def _fresh_metrics_dir() -> str:
    """A new per-replica multiprocess directory, with this process's metrics kept in memory.

    ``prometheus_client`` picks its storage when first imported: import it with no
    directory set (vLLM's frontend metrics then stay in this process's memory), then
    set the directory for the engine-core child processes vLLM spawns next.
    """
    inherited = os.environ.pop(MULTIPROC_ENV, None)
    import prometheus_client  # noqa: F401 - imported now, before the directory is set

    if inherited and "prometheus_client.values" in sys.modules:
        logger.warning("%s=%s was set when this replica started; its metrics may mix with "
                       "other processes'", MULTIPROC_ENV, inherited)
    return tempfile.mkdtemp(prefix="ray-engine-metrics-")


class VLLMEngine:
    """A Ray Serve deployment class: ``serve.deployment(VLLMEngine).bind(EngineConfig(...))``."""

    async def __init__(self, config: EngineConfig) -> None:
        from prometheus_client import REGISTRY, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector
        from ray import serve

        from integrations.vllm_v1.vllm_surface import names

        self.config = config
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self._actor, self._node = _actor_and_node()
        self._metrics_dir = _fresh_metrics_dir()
        args = names.parse_serve_args(config.serve_argv())
        os.environ[MULTIPROC_ENV] = self._metrics_dir  # for the engine core vLLM spawns
        try:
            self.engine = names.async_llm(args)
        finally:
            os.environ.pop(MULTIPROC_ENV, None)  # this process keeps its metrics in memory
        MultiProcessCollector(REGISTRY, path=self._metrics_dir)
        self.app = await names.openai_app(self.engine, args)
        server, _thread = start_http_server(0, addr=config.metrics_host, registry=REGISTRY)
        self._metrics_server = server
        self.metrics_address = f"{_advertised(config.metrics_host)}:{server.server_port}"
        self._targets = TargetsDirectory(config.targets_dir) if config.targets_dir else None
        if self._targets is not None:
            self._targets.write(self.replica, self.metrics_address, {
                "deployment": context.deployment, "app": context.app_name,
                "role": config.role, "node": self._node})
        self._queued: dict[int, tuple[float, str | None, str | None, int]] = {}
        """Requests without their first bytes yet: (arrival, class, tenant, prompt tokens)."""
        self._streaming = 0
        self._shape = _engine_shape(self.engine)
        self._ranks_by_deadline = _ranks_by_deadline(config.pipeline)
        logger.info("engine replica %s ready; metrics on http://%s/metrics", self.replica,
                    self.metrics_address)

    async def generate(self, request: EngineRequest) -> AsyncIterator[ReplyHead | bytes]:
        """Run ``request`` through vLLM's OpenAI app: a `ReplyHead`, then the rest of the body
        (the router's refusal, when it carries one, without the engine)."""
        if request.rejection is not None:
            yield self._refusal(request.rejection)
            return
        key = id(request)
        hint = request.hint
        self._queued[key] = (request.arrival_s or time.time(), hint.slo_class, hint.tenant,
                             hint.prompt_tokens)
        self._streaming += 1
        answer = call_asgi(self.app, request.method, request.path, body=request.body,
                           headers=dict(request.headers))
        waiting_first = True
        try:
            start = await anext(answer)
            assert isinstance(start, ResponseStart)
            first = await anext(answer, b"")
            self._queued.pop(key, None)
            waiting_first = False
            yield ReplyHead(status=start.status,
                            content_type=start.header("content-type", "application/json"),
                            first_chunk=first, replica=self.replica, actor=self._actor,
                            node=self._node, retry_after=start.header("retry-after"))
            async for chunk in answer:
                yield chunk
        finally:
            if waiting_first:
                self._queued.pop(key, None)
            self._streaming -= 1
            await answer.aclose()

    def _refusal(self, rejection: RouterRejection) -> ReplyHead:
        body = {"error": {"message": f"{rejection.reason}: no replica is predicted to meet "
                                     "this request's latency target now",
                          "type": rejection.reason, "code": 503}}
        retry = rejection.retry_after_s
        return ReplyHead(status=503, content_type="application/json",
                         first_chunk=json.dumps(body).encode(), replica=self.replica,
                         actor=self._actor, node=self._node,
                         retry_after=None if retry is None else str(max(1, math.ceil(retry))),
                         router_rejection=rejection)

    async def record_routing_stats(self) -> dict[str, Any]:
        """This replica's load, for the request router (Ray Serve pulls it periodically):
        vLLM's load gauges; the requests waiting for their first bytes (``queued``:
        arrival, class, tenant, prompt tokens) and their prompt tokens; the engine's step
        budget and KV capacity; where the pipeline has them, its learned step model's
        coefficients (``step_model``) and its SLO admission's headrooms in force."""
        stats: dict[str, Any] = {"running_requests": 0.0, "waiting_requests": 0.0,
                                 "kv_usage": 0.0}
        coefficients: dict[str, float] = {}
        for family in [*_vllm_families(), *_policy_families(self._metrics_dir)]:
            key = LOAD_GAUGES.get(family.name) or POLICY_GAUGES.get(family.name)
            if key is not None:
                stats[key] = sum(sample.value for sample in family.samples)
            elif family.name == STEP_MODEL_GAUGE:
                coefficients.update((s.labels.get("term", ""), s.value) for s in family.samples)
        queued = list(self._queued.values())
        stats.update(queued_prefill_tokens=sum(q[3] for q in queued), queued=queued,
                     in_flight=self._streaming, time_s=time.time(),
                     ranks_by_deadline=self._ranks_by_deadline,
                     metrics_address=self.metrics_address, **self._shape)
        if coefficients:
            stats["step_model"] = coefficients
        return stats

    async def check_health(self) -> None:
        """Ray Serve's health check: fails once the engine core has died."""
        await self.engine.check_health()

    def __del__(self) -> None:
        """Stop the engine and the metrics server; unregister the metrics target."""
        for step in (self._unregister, self._stop_engine):
            try:
                step()
            except Exception:  # noqa: BLE001 - shutting down, nothing left to tell
                logger.exception("engine replica shutdown step failed")

    def _unregister(self) -> None:
        if getattr(self, "_targets", None) is not None:
            self._targets.remove(self.replica)
        if getattr(self, "_metrics_server", None) is not None:
            self._metrics_server.shutdown()

    def _stop_engine(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()
        shutil.rmtree(getattr(self, "_metrics_dir", ""), ignore_errors=True)


def _vllm_families() -> list[Any]:
    """vLLM's frontend metric families in this process (in memory, see `_fresh_metrics_dir`)."""
    from prometheus_client import REGISTRY

    return list(REGISTRY.restricted_registry(list(LOAD_GAUGES)).collect())


def _policy_families(metrics_dir: str) -> list[Any]:
    """The pipeline's gauges the routing stats read, from the engine core's multiprocess
    files."""
    from prometheus_client.multiprocess import MultiProcessCollector

    wanted = {*POLICY_GAUGES, STEP_MODEL_GAUGE}
    return [f for f in MultiProcessCollector(None, path=metrics_dir).collect()
            if f.name in wanted]


def _engine_shape(engine: Any) -> dict[str, int]:
    """The engine's tokens per step (``max_num_batched_tokens``) and KV capacity in tokens,
    from its configuration (vLLM's frontend learns the block count from the engine core)."""
    config = engine.vllm_config
    cache = config.cache_config
    blocks = cache.num_gpu_blocks or 0
    return {"token_budget": int(config.scheduler_config.max_num_batched_tokens),
            "kv_capacity_tokens": int(blocks * cache.block_size)}


def _ranks_by_deadline(spec: Pipeline | str | Mapping[str, Any] | None) -> bool:
    """Whether the pipeline serves prefill earliest first-token deadline first."""
    from policies import TTFTDeadlineRanker

    if spec is None:
        return False
    return isinstance(resolve_pipeline(spec).ranking, TTFTDeadlineRanker)


def _advertised(host: str) -> str:
    """The address others reach ``host`` at: the node's address for a wildcard bind."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    import ray

    return ray.util.get_node_ip_address()


def _actor_and_node() -> tuple[str, str]:
    import ray

    context = ray.get_runtime_context()
    return context.get_actor_name() or "", context.get_node_id()
