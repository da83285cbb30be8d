"""Serve pipelines on Ray Serve: vLLM engine replicas behind an OpenAI ingress, with our router.

Ray Serve places, health-checks and restarts the replicas; this package adds only what
Ray Serve lets an application plug in:

* `VLLMEngine` (``engine``): a deployment whose replicas each run one vLLM engine with a
  `Pipeline`, started from ``vllm serve`` flags (vLLM's own OpenAI application, in-process);
* `PDRequestRouter` (``router``): `policies.pd.router.PDRouter` (prefix affinity, bounded
  load, failover) as the deployment's Ray Serve request router, fed by the replicas'
  routing stats and the `RoutingHint` (``prefix``) the ingress computes per request;
* `ClusterRequestRouter` (``cluster_router``): any `policies.cluster_routing` router
  (`SLORouter`, the peers) as the deployment's request router, fed by the replicas' reports
  (`VLLMEngine.record_routing_stats`); its refusals answered 503 with ``Retry-After``;
* `OpenAIIngress` (``ingress``): ``/v1/completions`` and ``/v1/chat/completions``
  (streamed or not), prefill/decode orchestration, retries before the first byte,
  ``/metrics``;
* `ServeConfig` / `build_app` / `deploy` (``app``): the application, colocated or
  disaggregated; `LocalCluster` (``cluster``): a multi-node Ray cluster on one machine;
* ``grafana_dashboard.json``: a dashboard over the metrics the app exposes.

``python -m integrations.ray_serve.demo`` runs it end to end (docs: ``docs/deploy_ray.md``).
Requires the ``ray`` extra (``pip install 'llm-serving-policies[ray]'``).
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "ServeConfig": "integrations.ray_serve.app",
    "build_app": "integrations.ray_serve.app",
    "deploy": "integrations.ray_serve.app",
    "LocalCluster": "integrations.ray_serve.cluster",
    "EngineConfig": "integrations.ray_serve.engine",
    "VLLMEngine": "integrations.ray_serve.engine",
    "OpenAIIngress": "integrations.ray_serve.ingress",
    "PDRequestRouter": "integrations.ray_serve.router",
    "ClusterRequestRouter": "integrations.ray_serve.cluster_router",
    "RoutingHint": "integrations.ray_serve.prefix",
    "PromptKeys": "integrations.ray_serve.prefix",
    "TargetsDirectory": "integrations.ray_serve.metrics",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
