"""The ingress's Prometheus metrics: what the router decided and how every request ended.

They live in the ingress replica's process, where Ray Serve runs the request routers
of the handles the ingress holds, and are served at the ingress's ``/metrics``. Each
engine replica serves vLLM's metrics and the pipeline's on its own port (see
`integrations.vllm_v1.metrics`), listed for Prometheus in a file-SD directory
(`TargetsDirectory`).

* ``policies:router_decisions_total{deployment,reason}``: one per routed request; reason
  ``affinity`` / ``session`` / ``spillover`` / ``least_loaded`` (`policies.pd.router.RouteReason`),
  a cluster router's `policies.cluster_routing.RouteCause` (``feasible``, ``cache``,
  ``retried``, ``no_feasible``, ...), or
  ``fallback`` when Ray Serve sent the request to another replica than the one chosen
  (the chosen one was full or had just died).
* ``policies:router_failovers_total{deployment}``: decisions that avoided a replica
  known to be gone while it held the longest cached prefix.
* ``policies:router_rejected_with_room_total{deployment}``: a cluster router
  (`integrations.ray_serve.cluster_router`) passed a replica's rejection on to the client
  while another replica was predicted to meet the request's targets
  (`policies.cluster_routing.ClusterRouter.replica_with_room`).
* ``policies:router_replicas{deployment,state}``: replicas the router routes to (``up``)
  or remembers as gone (``down``).
* ``policies:ingress_requests_total{endpoint,outcome}``: every request the ingress was
  offered ends ``completed``, ``rejected`` or ``cancelled`` (the client went away first).
* ``policies:ingress_rejections_total{reason}``: rejected requests by reason:
  ``invalid_request`` (400), the pipeline's reason for a 429/503 (``queue_full``, ...),
  ``replica_failed`` (every attempt's replica died before its first byte, or the serving
  one died mid-stream), ``engine_error`` (5xx), ``http_<status>`` otherwise.
* ``policies:ingress_retries_total{deployment}``: attempts repeated on another replica.
* ``policies:ingress_rejection_retries_total{deployment,outcome}``: replica 503s sent once
  more through a cluster router, ``placed`` on another replica or ``passed_on`` to the client.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)
"""The ingress process's registry (routers and ingress share it)."""

ROUTER_DECISIONS = Counter("policies:router_decisions", "Routing decisions by reason",
                           ["deployment", "reason"], registry=REGISTRY)
ROUTER_FAILOVERS = Counter("policies:router_failovers",
                           "Decisions that avoided a gone replica holding the longest prefix",
                           ["deployment"], registry=REGISTRY)
ROUTER_REPLICAS = Gauge("policies:router_replicas", "Replicas the router knows, by state",
                        ["deployment", "state"], registry=REGISTRY)
ROUTER_REJECTED_WITH_ROOM = Counter(
    "policies:router_rejected_with_room",
    "Replica rejections passed on to the client while another replica had room",
    ["deployment"], registry=REGISTRY)
INGRESS_REQUESTS = Counter("policies:ingress_requests", "Requests by endpoint and outcome",
                           ["endpoint", "outcome"], registry=REGISTRY)
INGRESS_REJECTIONS = Counter("policies:ingress_rejections", "Rejected requests by reason",
                             ["reason"], registry=REGISTRY)
INGRESS_RETRIES = Counter("policies:ingress_retries",
                          "Attempts repeated on another replica after a replica failed",
                          ["deployment"], registry=REGISTRY)
INGRESS_REJECTION_RETRIES = Counter(
    "policies:ingress_rejection_retries",
    "Replica 503s sent once more through a cluster router: placed on another replica, or "
    "passed on to the client", ["deployment", "outcome"], registry=REGISTRY)

ROUTE_REASONS = ("affinity", "session", "spillover", "least_loaded", "unavailable", "fallback")
OUTCOMES = ("completed", "rejected", "cancelled")
REJECTION_REASONS = ("invalid_request", "replica_failed", "engine_error")
ENDPOINTS = ("completions", "chat/completions")


def declare(deployments: tuple[str, ...]) -> None:
    """Create every label set the dashboard reads, at 0, so each metric is on the first scrape."""
    for deployment in deployments:
        for reason in ROUTE_REASONS:
            ROUTER_DECISIONS.labels(deployment, reason)
        ROUTER_FAILOVERS.labels(deployment)
        ROUTER_REJECTED_WITH_ROOM.labels(deployment)
        INGRESS_RETRIES.labels(deployment)
    for endpoint in ENDPOINTS:
        for outcome in OUTCOMES:
            INGRESS_REQUESTS.labels(endpoint, outcome)
    for reason in REJECTION_REASONS:
        INGRESS_REJECTIONS.labels(reason)


@attrs.frozen
class TargetsDirectory:
    """A Prometheus ``file_sd_configs`` directory: one JSON file per engine replica.

    Each replica writes ``<replica>.json`` (its ``host:port`` and labels) when its
    metrics server starts and removes it when it shuts down; a replica killed outright
    leaves its file, which Prometheus then shows as a target that is down. Point
    Prometheus at ``<path>/*.json``; on several machines give each node its own
    directory and Prometheus agent, or a shared file system.
    """

    path: Path = attrs.field(converter=Path)

    @classmethod
    def default(cls) -> TargetsDirectory:
        """``$TMPDIR/llm-serving-policies-targets`` (one per machine)."""
        return cls(Path(tempfile.gettempdir()) / "llm-serving-policies-targets")

    def write(self, replica: str, address: str, labels: dict[str, str]) -> Path:
        """Register ``replica``'s metrics endpoint ``host:port`` (atomically)."""
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / f"{replica}.json"
        temporary = target.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps([{"targets": [address],
                                          "labels": {"replica": replica, **labels}}]))
        temporary.replace(target)
        return target

    def remove(self, replica: str) -> None:
        """Forget ``replica``'s endpoint."""
        (self.path / f"{replica}.json").unlink(missing_ok=True)

    def targets(self, reachable_only: bool = True) -> list[dict]:
        """Every registered endpoint as ``{"targets": [...], "labels": {...}}`` (file-SD
        form); with ``reachable_only``, those accepting a TCP connection now."""
        found = []
        for file in sorted(self.path.glob("*.json")) if self.path.is_dir() else ():
            try:
                entries = json.loads(file.read_text())
            except (OSError, ValueError):
                continue
            found += [e for e in entries if not reachable_only or _accepts(e["targets"][0])]
        return found


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False
