"""Prefix-cache eviction orders, as layers on one base (cachetools-style).

An eviction order holds the evictable blocks of a prefix cache and picks the victims
(`EvictionOrder`); `integrations.vllm_v1.cache.eviction` installs one in vLLM. Each class
below is one layer over the one before it, with its own switch, counters (in
`EvictionStats`) and invariants:

| class | adds |
|---|---|
| `LRU` | the base order (vLLM's): segments, entries, chains, release order |
| `FrequencyLRU` | PROBATION and PROTECTED by use count, ghost history, the preemption shield |
| `CancellationRetention` | a cancelled request's blocks kept like reused ones |
| `PromptVersioning` | chains of prompts a tenant replaced demoted (`PromptVersions`) |
| `WaitingQueueAwareness` | blocks a waiting request will hit evicted last (WANTED) |
| `SegmentedLRU` | all of the above: the shipped frequency order |
| `SetDueling` | SLRU or LRU, whichever a shadow of each would hit more |
| `DuelingSLRU` | session pins on top (`SessionPins`): the ``cache`` preset's order |

A layer reaches the segments through `LRU.segment_of`, `LRU.keys_in` and `LRU.move`
and the `Segment` members, never through another module's private names.
"""

from policies.kv.eviction.dueling import SetDueling
from policies.kv.eviction.layers import (
    CancellationRetention,
    PromptVersioning,
    SegmentedLRU,
    WaitingQueueAwareness,
)
from policies.kv.eviction.lru import LRU
from policies.kv.eviction.pinning import DuelingSLRU
from policies.kv.eviction.segmented import FrequencyLRU
from policies.kv.eviction.segments import (
    EvictionOrder,
    EvictionStats,
    ReportsEvictionStats,
    RetentionHints,
    Segment,
    WaitingHints,
)
from policies.kv.eviction.sessions import SessionGaps, SessionHints, SessionPins, session_tenant

__all__ = [
    "LRU",
    "CancellationRetention",
    "DuelingSLRU",
    "EvictionOrder",
    "EvictionStats",
    "FrequencyLRU",
    "PromptVersioning",
    "ReportsEvictionStats",
    "RetentionHints",
    "Segment",
    "SegmentedLRU",
    "SessionGaps",
    "SessionHints",
    "SessionPins",
    "SetDueling",
    "WaitingHints",
    "WaitingQueueAwareness",
    "session_tenant",
]
