"""Serving policies for LLM engines: pure Python, no vLLM, no torch.

Policies see frozen views (`RequestView`, `LoadSnapshot`), take the step's
``now`` as an argument and return decisions. `integrations.vllm_v1` runs them
inside a real vLLM V1 engine.
"""

from policies.admission import (
    AdmissionController,
    AdmissionDecision,
    AdmissionStats,
    QueueDepthLimit,
)
from policies.cache_aware import CacheAwareRanker, LoadAwareRanking
from policies.cache_warming import PrefixWarmer, PrefixWarmerStats, WarmingPolicy, WarmPrefix
from policies.clock import ManualClock
from policies.deadline import EDFRanker
from policies.errors import InvalidRequestMetadata
from policies.eviction import (
    LRU,
    EvictionOrder,
    EvictionStats,
    RetentionHints,
    Segment,
    SegmentedLRU,
)
from policies.fairness import WFQ, WFQStats
from policies.isolation import (
    PrefillBudgetStats,
    QuotaPolicy,
    TenantPrefillBudget,
    TenantQuota,
    TenantUsage,
    TokenCaps,
)
from policies.kv_tiering import Tier, TierMove, TierPlacement, TierStats
from policies.levels import MLFQ, MLFQStats
from policies.metadata import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    RequestMetadata,
    parse_request_metadata,
)
from policies.output_lengths import OutputLengths
from policies.pd_planner import PDPlan, PDPlanner
from policies.pd_router import (
    InstanceLoad,
    LeastLoadedRouter,
    PDRouter,
    PDRouterStats,
    PrefixIndex,
    RoundRobinRouter,
    RouteDecision,
    RouteReason,
    chain_keys,
)
from policies.pd_scheduling import (
    DecodeKVGate,
    DecodeStepGate,
    DecodeStepGateStats,
    StartGate,
)
from policies.prefill_guard import InteractivePrefillGuard, PrefillGuardStats
from policies.prompt_versions import PromptVersions
from policies.protocols import (
    AdmissionPolicy,
    DeadlinePolicy,
    FairnessPolicy,
    KVBlockQuota,
    LevelPolicy,
    LifecycleObserver,
    PreemptionPolicy,
    RankingPolicy,
    StepObserver,
    TokenCapPolicy,
)
from policies.ranking import FCFSOrder, QoSRanker
from policies.rate import TokenBucket, TokenBucketStats
from policies.slo_admission import (
    PrefillLedger,
    PrefillLedgerStats,
    SLOAdmission,
    SLOAdmissionStats,
    SLODecision,
    SLOTarget,
    SLOVerdict,
    TTFTDeadlineRanker,
)
from policies.slot_preemption import Preemption, SlotPreemption, SlotPreemptionStats
from policies.speculative import (
    AutomatonStats,
    Draft,
    DraftConfig,
    DrafterStats,
    DraftSource,
    SharedCacheStats,
    SharedSuffixCache,
    SpecMetrics,
    SpecMetricsStats,
    SpeculationBudget,
    SpeculationBudgetStats,
    SpeculationPolicy,
    SuffixAutomaton,
    SuffixDrafter,
)
from policies.step_budget import StepPrefillBudget, StepPrefillBudgetStats
from policies.step_model import (
    CONSERVATIVE_PRIOR,
    OnlineStepTimeModel,
    StepFeatures,
    StepModelStats,
    StepTimeModel,
)
from policies.views import DEFAULT_TENANT, LoadSnapshot, RequestView
from policies.watermarks import KVWatermarks, WatermarkLevel

__all__ = [
    "OutputLengths",
    "PrefillLedger",
    "PrefillLedgerStats",
    "SLOAdmission",
    "SLOAdmissionStats",
    "SLODecision",
    "SLOTarget",
    "SLOVerdict",
    "Preemption",
    "PreemptionPolicy",
    "SlotPreemption",
    "SlotPreemptionStats",
    "StepPrefillBudget",
    "StepPrefillBudgetStats",
    "StepTimeModel",
    "StepObserver",
    "OnlineStepTimeModel",
    "StepFeatures",
    "StepModelStats",
    "CONSERVATIVE_PRIOR",
    "TTFTDeadlineRanker",
    "Tier",
    "TierMove",
    "TierPlacement",
    "TierStats",
    "PrefillBudgetStats",
    "TenantPrefillBudget",
    "TenantQuota",
    "QuotaPolicy",
    "TenantUsage",
    "TokenCaps",
    "DEFAULT_TENANT",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "AdmissionController",
    "AdmissionDecision",
    "AdmissionStats",
    "DeadlinePolicy",
    "FairnessPolicy",
    "LevelPolicy",
    "MLFQ",
    "MLFQStats",
    "InstanceLoad",
    "LeastLoadedRouter",
    "PDRouter",
    "PDRouterStats",
    "PrefixIndex",
    "RoundRobinRouter",
    "RouteDecision",
    "RouteReason",
    "chain_keys",
    "DecodeKVGate",
    "DecodeStepGate",
    "DecodeStepGateStats",
    "StartGate",
    "PDPlan", "PDPlanner",
    "EDFRanker",
    "EvictionOrder",
    "EvictionStats",
    "LRU",
    "Segment",
    "SegmentedLRU",
    "PromptVersions",
    "RetentionHints",
    "CacheAwareRanker",
    "InteractivePrefillGuard",
    "PrefillGuardStats",
    "PrefixWarmer",
    "WarmingPolicy",
    "PrefixWarmerStats",
    "WarmPrefix",
    "LoadAwareRanking",
    "KVBlockQuota",
    "KVWatermarks",
    "AdmissionPolicy",
    "FCFSOrder",
    "InvalidRequestMetadata",
    "LifecycleObserver",
    "LoadSnapshot",
    "ManualClock",
    "QoSRanker",
    "QueueDepthLimit",
    "RankingPolicy",
    "RequestMetadata",
    "RequestView",
    "TokenBucket",
    "TokenBucketStats",
    "TokenCapPolicy",
    "WFQ",
    "WFQStats",
    "WatermarkLevel",
    "parse_request_metadata",
    "AutomatonStats",
    "Draft",
    "DraftConfig",
    "DraftSource",
    "DrafterStats",
    "SharedCacheStats",
    "SharedSuffixCache",
    "SpecMetrics",
    "SpecMetricsStats",
    "SpeculationBudget",
    "SpeculationBudgetStats",
    "SpeculationPolicy",
    "SuffixAutomaton",
    "SuffixDrafter",
]
