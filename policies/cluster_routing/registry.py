"""Every cluster router by name: what the cluster replay and the Ray Serve router build."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.peers import (
    KVOverlapReplicas,
    PowerOfTwoReplicas,
    RoundRobinReplicas,
    SessionStickyReplicas,
    StickyUntilSaturated,
)
from policies.cluster_routing.slo_router import SLORouter
from policies.slo.fairness import DEFAULT_HALF_LIFE_S, ClassFairShare

ROUTERS = ("slo", "slo-keep-sessions", "pow2", "round-robin", "kv_overlap", "session-sticky",
           "sticky-until-saturated")
"""``slo``: `SLORouter`; ``slo-keep-sessions``: its ``keep_sessions`` variant; then the peers:
`PowerOfTwoReplicas`, `RoundRobinReplicas`, `KVOverlapReplicas`, `SessionStickyReplicas`,
`StickyUntilSaturated`."""
OURS = ("slo", "slo-keep-sessions")


def make_router(name: str, replicas: Sequence[str], *, block_size_tokens: int = 16,
                index_capacity_blocks: int = 100_000, saturation_tokens: int = 8192,
                seed: int = 0, fairness_weights: Mapping[str, float] | None = None,
                fairness_half_life_s: float = DEFAULT_HALF_LIFE_S) -> ClusterRouter:
    """A fresh router by name (`ROUTERS`) over ``replicas``; ``saturation_tokens`` is
    `StickyUntilSaturated`'s limit, ``seed`` the random routers' seed. With
    ``fairness_weights`` (the ``slo`` declaration's ``fairness``: `SLOSpec.fairness_weights`
    and ``fairness_half_life_s``), our routers share each class between tenants by weight
    across the cluster (`SLORouter.fairness`, a fresh `ClassFairShare`); the peers weigh no
    tenants.

    Raises:
        ValueError: for an unknown name (the message lists `ROUTERS`).
    """
    common = {"replicas": tuple(replicas), "block_size_tokens": block_size_tokens,
              "index_capacity_blocks": index_capacity_blocks}
    if name in OURS:
        fairness = None if fairness_weights is None else ClassFairShare(
            weights=fairness_weights, half_life_s=fairness_half_life_s)
        return SLORouter(**common, keep_sessions=name == "slo-keep-sessions", fairness=fairness)
    if name == "pow2":
        return PowerOfTwoReplicas(**common, rng=random.Random(seed))
    if name == "round-robin":
        return RoundRobinReplicas(**common)
    if name == "kv_overlap":
        return KVOverlapReplicas(**common, rng=random.Random(seed))
    if name == "session-sticky":
        return SessionStickyReplicas(**common)
    if name == "sticky-until-saturated":
        return StickyUntilSaturated(**common, saturation_tokens=saturation_tokens)
    raise ValueError(f"unknown router {name!r}: use one of {', '.join(ROUTERS)}")
