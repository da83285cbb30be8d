"""KV cache: what stays cached, what is ranked by it, what is warmed and where it lives.

Eviction orders, prompt versions, cache-aware ranking, prefix warming and tier placement.
Modules: `cache_aware`, `cache_warming`, `eviction`, `prompt_versions`, `tiering`. Every name
here is also exported by `policies`.
"""

from policies.kv.cache_aware import CacheAwareRanker, LoadAwareRanking
from policies.kv.cache_warming import PrefixWarmer, PrefixWarmerStats, WarmingPolicy, WarmPrefix
from policies.kv.eviction import (
    LRU,
    DuelingSLRU,
    EvictionOrder,
    EvictionStats,
    RetentionHints,
    Segment,
    SegmentedLRU,
    SessionGaps,
    SessionHints,
    SessionPins,
)
from policies.kv.prompt_versions import PromptVersions
from policies.kv.tiering import Tier, TierMove, TierPlacement, TierStats

__all__ = [
    "CacheAwareRanker",
    "DuelingSLRU",
    "EvictionOrder",
    "EvictionStats",
    "LRU",
    "LoadAwareRanking",
    "PrefixWarmer",
    "PrefixWarmerStats",
    "PromptVersions",
    "RetentionHints",
    "Segment",
    "SegmentedLRU",
    "SessionGaps",
    "SessionHints",
    "SessionPins",
    "Tier",
    "TierMove",
    "TierPlacement",
    "TierStats",
    "WarmPrefix",
    "WarmingPolicy",
]
