"""Routers for a cluster of colocated replicas: the peers users pick, and `SLORouter`.

Every router sees the same things: a `ClusterRequest` (its prompt as chained block keys,
its session, its SLO targets) and one `ReplicaReport` per replica (queued prefill tokens,
running requests, KV usage and, where the replica learns one, its step-time model), and
returns a frozen `ClusterDecision`. What a router knows of the replicas' prefix caches is
what it sent where (a `PrefixIndex`, the approximate mode of Dynamo's and llm-d's routers).

Peers, from their published descriptions:

- `RoundRobinReplicas`: each accepting replica in turn.
- `PowerOfTwoReplicas` (Ray Serve's default): of two random replicas, fewer ongoing requests.
- `KVOverlapReplicas` (Dynamo's KV router): lowest ``overlap_weight * prefill_blocks +
  decode_blocks``, prefill blocks counting the queued prompt tokens and this prompt's
  uncached ones, decode blocks the active KV.
- `SessionStickyReplicas`: a session stays on the replica its first call went to (the
  least loaded then); calls without a session go to the least loaded.
- `StickyUntilSaturated` (llm-d's default since 2026-08): the replica holding the longest
  cached prefix, unless its token load (queued prefill tokens) has reached a calibrated
  ``saturation_tokens``; then, and with no cache hit, the lowest token load.

`SLORouter` predicts each replica's TTFT for the request from its report (the learned step
model's prefill rate over the queued and uncached tokens, beside the running decodes) and
routes among the replicas that meet the deadline, preferring the session's replica, then the
earliest first token (a cached prefix shortens it). With none, it demotes where the
request declares a lower class that some replica meets, else rejects with a Retry-After.
With ``fairness`` (the ``slo`` declaration's `ClassFairShare`), it charges each request it
routes to its tenant across the cluster and plans a tenant over its weighted share on part
of each replica's prefill rate, so that tenant is refused first when the replicas fill up. A
replica's own rejection gets one retry (`retry`) elsewhere, within the deadline; every
router counts the replica rejections it passes on while another replica had room
(``rejected_with_room``, by `DeadlineTest`). `make_router` builds any of them by name
(`ROUTERS`), for the cluster replay and the Ray Serve request router alike.
"""

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.peers import (
    KVOverlapReplicas,
    PowerOfTwoReplicas,
    RoundRobinReplicas,
    SessionStickyReplicas,
    StickyUntilSaturated,
)
from policies.cluster_routing.prediction import DeadlineTest
from policies.cluster_routing.registry import OURS, ROUTERS, make_router
from policies.cluster_routing.reports import (
    ClusterDecision,
    ClusterRequest,
    ClusterRouterStats,
    ReplicaReport,
    RouteCause,
)
from policies.cluster_routing.slo_router import SLORouter

__all__ = [
    "OURS",
    "ROUTERS",
    "ClusterDecision",
    "ClusterRequest",
    "ClusterRouter",
    "ClusterRouterStats",
    "DeadlineTest",
    "KVOverlapReplicas",
    "PowerOfTwoReplicas",
    "ReplicaReport",
    "RoundRobinReplicas",
    "RouteCause",
    "SLORouter",
    "SessionStickyReplicas",
    "StickyUntilSaturated",
    "make_router",
]
