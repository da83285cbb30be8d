"""Every cluster router by name: what the cluster replay and the Ray Serve router build."""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.cluster_routing.base import ClusterRouter
from policies.cluster_routing.peers import (
    KVOverlapReplicas,
    PowerOfTwoReplicas,
    RoundRobinReplicas,
    SessionStickyReplicas,
    StickyUntilSaturated,
)
from policies.cluster_routing.slo_router import SLORouter

ROUTERS = ("slo", "slo-keep-sessions", "pow2", "round-robin", "kv_overlap", "session-sticky",
           "sticky-until-saturated")
"""``slo``: `SLORouter`; ``slo-keep-sessions``: its ``keep_sessions`` variant; then the peers:
`PowerOfTwoReplicas`, `RoundRobinReplicas`, `KVOverlapReplicas`, `SessionStickyReplicas`,
`StickyUntilSaturated`."""
OURS = ("slo", "slo-keep-sessions")


def make_router(name: str, replicas: Sequence[str], *, block_size_tokens: int = 16,
                index_capacity_blocks: int = 100_000, saturation_tokens: int = 8192,
                seed: int = 0) -> ClusterRouter:
    """A fresh router by name (`ROUTERS`) over ``replicas``; ``saturation_tokens`` is
    `StickyUntilSaturated`'s limit, ``seed`` the random routers' seed.

    Raises:
        ValueError: for an unknown name (the message lists `ROUTERS`).
    """
    common = {"replicas": tuple(replicas), "block_size_tokens": block_size_tokens,
              "index_capacity_blocks": index_capacity_blocks}
    if name in OURS:
        return SLORouter(**common, keep_sessions=name == "slo-keep-sessions")
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
