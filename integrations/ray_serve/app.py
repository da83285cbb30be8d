"""`ServeConfig` and `build_app`: the Ray Serve application, colocated or prefill/decode.

Colocated: ``replicas`` engine replicas (`VLLMEngine`, each running the pipeline)
behind the `OpenAIIngress`, with `PDRequestRouter` (``router="pd_router"``, the default), Ray
Serve's default power-of-two-choices router (``router="pow2"``) or a
`policies.cluster_routing` router (``router="slo"``, ``"session-sticky"``, ...:
`ClusterRequestRouter`) choosing the replica of each request.

Disaggregated (``prefill_replicas > 0``): a ``prefill`` deployment of engines running
the ``pd-prefill`` role (`integrations.vllm_v1.config.pd_roles.PD_PREFILL` applied to the
pipeline, ``kv_producer``) and a ``decode`` deployment of ``replicas`` engines running
the ``pd-decode`` role (``kv_consumer``), each with its own request router, joined by a
vLLM KV connector: ``ExampleConnector`` over a shared directory on CPU (every node must
see the same ``kv_storage_dir``), ``NixlConnector`` on GPUs.

    with LocalCluster(nodes=2) as cluster:
        handle = deploy(ServeConfig(model=path, pipeline="default",
                                    vllm_args=("--block-size", "32")))
        # OpenAI API at cluster.url + "/v1/..."
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from integrations.ray_serve.engine import EngineConfig, VLLMEngine
from integrations.ray_serve.ingress import IngressConfig, OpenAIIngress
from integrations.ray_serve.metrics import TargetsDirectory
from integrations.vllm_v1.pipeline import Pipeline
from policies.cluster_routing import ROUTERS as ROUTER_NAMES

CLUSTER_ROUTERS = tuple(name for name in ROUTER_NAMES if name != "pow2")
"""The `policies.cluster_routing` routers, run by
`integrations.ray_serve.cluster_router.ClusterRequestRouter` (``pow2`` is Ray Serve's own)."""
ROUTERS = ("pd_router", "pow2", *CLUSTER_ROUTERS)
"""``pd_router``: `integrations.ray_serve.router.PDRequestRouter`; ``pow2``: Ray Serve's default;
the rest (`CLUSTER_ROUTERS`): ``slo`` (`policies.cluster_routing.SLORouter`) and the peers."""
CONNECTORS = ("auto", "example", "nixl")


def _choice(options: tuple[str, ...]):
    def check(_instance: object, attribute: attrs.Attribute, value: str) -> None:
        if value not in options:
            raise ValueError(f"ServeConfig.{attribute.name} must be one of {list(options)}, "
                             f"got {value!r}")

    return check


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@attrs.frozen(kw_only=True)
class ServeConfig:
    """One Ray Serve application of vLLM engines running a pipeline."""

    model: str
    pipeline: Pipeline | str | Mapping[str, Any] | None = None
    """What every engine runs (see `EngineConfig.pipeline`); None: vLLM's stock scheduler."""
    vllm_args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """``vllm serve`` flags for every engine (``--dtype``, ``--block-size``, ...)."""
    replicas: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    """Engine replicas (the decode pool when disaggregated)."""
    prefill_replicas: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Prefill replicas; 0: colocated serving."""
    router: str = attrs.field(default="pd_router", validator=_choice(ROUTERS))
    """Which request router picks each request's engine replica (`ROUTERS`)."""
    router_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    """The router's ``initialize_state`` arguments: `PDRequestRouter`'s (``balance_epsilon``,
    ...), or `ClusterRequestRouter`'s (``saturation_tokens``, ``seed``, ``slo``: the SLO
    declaration, by default the pipeline's own, `Pipeline.slo`)."""
    block_size_tokens: int | None = None
    """Tokens per prefix key; None: the ``--block-size`` in ``vllm_args``, else 16."""
    kv_connector: str = attrs.field(default="auto", validator=_choice(CONNECTORS))
    """Disaggregated only: ``example`` (CPU, shared directory), ``nixl`` (GPU), ``auto``."""
    kv_storage_dir: str | None = None
    """``ExampleConnector``'s shared directory (None: a fresh temporary one)."""
    max_ongoing_requests: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    """Requests Ray Serve lets one engine replica hold (vLLM batches them)."""
    max_replicas_per_node: int | None = 1
    """Spread each deployment's replicas over nodes; None: no limit."""
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    """GPUs Ray reserves for each engine replica (1 per tensor-parallel rank on GPUs)."""
    runtime_env: Mapping[str, Any] = attrs.field(factory=dict)
    """Ray runtime environment of the engine replicas (``env_vars``, ...)."""
    routing_stats_period_s: float = attrs.field(default=0.5, validator=attrs.validators.gt(0))
    """How often Ray Serve pulls each replica's load for the router."""
    max_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    """Tries per request when replicas die before answering."""
    metrics_host: str = "127.0.0.1"
    """Where engine replicas serve their metrics (``0.0.0.0``: every interface, for a remote
    Prometheus; the node's address is registered)."""
    targets_dir: str | None = None
    """Where replicas register their metrics endpoints (None: a directory per app name)."""
    name: str = "llm"
    """The Serve application's name."""

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on separate deployments."""
        return self.prefill_replicas > 0

    def hint_block_size(self) -> int:
        """Tokens per prefix key (see ``block_size_tokens``)."""
        if self.block_size_tokens is not None:
            return self.block_size_tokens
        value = _flag_value(self.vllm_args, "--block-size")
        return int(value) if value else 16

    def targets(self) -> TargetsDirectory:
        """The metrics targets directory of this app."""
        if self.targets_dir is not None:
            return TargetsDirectory(self.targets_dir)
        return TargetsDirectory(TargetsDirectory.default().path / self.name)


def _connector_args(config: ServeConfig, role: str, storage: str) -> tuple[str, ...]:
    from integrations.vllm_v1.pd.launch import (
        NIXL_CONNECTOR_CONFIG,
        example_connector_config,
        runs_on_cpu,
    )

    kind = config.kv_connector
    if kind == "auto":
        kind = "example" if runs_on_cpu() else "nixl"
    value = example_connector_config(role, storage) if kind == "example" else \
        NIXL_CONNECTOR_CONFIG
    return ("--kv-transfer-config", value)


def _engine_deployment(config: ServeConfig, name: str, replicas: int) -> Any:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    if config.router == "pd_router":
        from integrations.ray_serve.router import PDRequestRouter

        router = RequestRouterConfig(
            request_router_class=PDRequestRouter,
            request_router_kwargs={"deployment": name,
                                   "block_size_tokens": config.hint_block_size(),
                                   **config.router_kwargs},
            request_routing_stats_period_s=config.routing_stats_period_s)
    elif config.router in CLUSTER_ROUTERS:
        from integrations.ray_serve.cluster_router import ClusterRequestRouter, class_declaration

        spec = None if config.pipeline is None else _as_pipeline(config.pipeline).slo
        declared = None if spec is None else class_declaration(spec)
        router = RequestRouterConfig(
            request_router_class=ClusterRequestRouter,
            request_router_kwargs={"router": config.router, "deployment": name,
                                   "block_size_tokens": config.hint_block_size(),
                                   "slo": declared, **config.router_kwargs},
            request_routing_stats_period_s=config.routing_stats_period_s)
    else:
        router = RequestRouterConfig(request_routing_stats_period_s=config.routing_stats_period_s)
    options: dict[str, Any] = {"num_cpus": config.num_cpus_per_replica}
    if config.num_gpus_per_replica:
        options["num_gpus"] = config.num_gpus_per_replica
    if config.runtime_env:
        options["runtime_env"] = dict(config.runtime_env)
    extra = {} if config.max_replicas_per_node is None else {
        "max_replicas_per_node": config.max_replicas_per_node}
    return serve.deployment(VLLMEngine, name=name, num_replicas=replicas,
                            max_ongoing_requests=config.max_ongoing_requests,
                            ray_actor_options=options, request_router_config=router,
                            health_check_period_s=5.0, graceful_shutdown_timeout_s=20.0,
                            **extra)


def build_app(config: ServeConfig) -> Any:
    """The bound Serve application (pass it to ``serve.run``), see the module docstring."""
    from ray import serve

    from integrations.vllm_v1.config.pd_roles import PD_DECODE, PD_PREFILL

    targets = str(config.targets().path)
    base = {"model": config.model, "metrics_host": config.metrics_host, "targets_dir": targets}
    ingress = IngressConfig(model=config.model, block_size_tokens=config.hint_block_size(),
                            max_attempts=config.max_attempts,
                            engine_label="decode" if config.disaggregated else "engine",
                            targets_dir=targets,
                            retry_rejections=config.router in CLUSTER_ROUTERS)
    front = serve.deployment(OpenAIIngress, name="ingress", num_replicas=1,
                             ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=1024)
    if not config.disaggregated:
        engine = _engine_deployment(config, "engine", config.replicas).bind(EngineConfig(
            pipeline=config.pipeline, vllm_args=config.vllm_args, role="engine", **base))
        return front.bind(ingress, engine)
    storage = config.kv_storage_dir or tempfile.mkdtemp(prefix="ray-pd-kv-")
    Path(storage).mkdir(parents=True, exist_ok=True)
    user = _as_pipeline(config.pipeline)
    roles = {"prefill": (PD_PREFILL, "kv_producer"), "decode": (PD_DECODE, "kv_consumer")}
    bound = {}
    for name, (role, kv_role) in roles.items():
        replicas = config.prefill_replicas if name == "prefill" else config.replicas
        bound[name] = _engine_deployment(config, name, replicas).bind(EngineConfig(
            pipeline=role.applied_to(user),
            vllm_args=(*role.vllm_args(), *config.vllm_args,
                       *_connector_args(config, kv_role, storage)),
            role=name, **base))
    return front.bind(ingress, bound["decode"], bound["prefill"])


def _as_pipeline(spec: Pipeline | str | Mapping[str, Any] | None) -> Pipeline:
    from integrations.vllm_v1.config.spec import resolve_pipeline

    return Pipeline() if spec is None else resolve_pipeline(spec)


def deploy(config: ServeConfig, *, route_prefix: str = "/") -> Any:
    """``serve.run`` the app under ``route_prefix`` (Ray and Serve must be running); returns
    the ingress's handle once every replica is up."""
    from ray import serve

    targets = config.targets()
    if targets.path.is_dir():  # files of an earlier run of this app name
        for stale in targets.path.glob("*.json"):
            stale.unlink(missing_ok=True)
    return serve.run(build_app(config), name=config.name, route_prefix=route_prefix)
