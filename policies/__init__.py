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
from policies.concurrency_limit import ConcurrencyLimit, ConcurrencyLimitStats
from policies.deadline import EDFRanker
from policies.errors import InvalidRequestMetadata
from policies.eviction import (
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
from policies.fairness import WFQ, WFQStats
from policies.frontend_gate import FrontendGate, FrontendGateStats
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
from policies.slo import (
    ClassFairShare,
    ClassFairShareStats,
    ClassGrants,
    PathDelays,
    PathDelaysStats,
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
    "AdmissionController",
    "AdmissionDecision",
    "AdmissionPolicy",
    "AdmissionStats",
    "AutomatonStats",
    "CONSERVATIVE_PRIOR",
    "CacheAwareRanker",
    "ClassFairShare",
    "ClassFairShareStats",
    "ClassGrants",
    "ConcurrencyLimit",
    "ConcurrencyLimitStats",
    "DEFAULT_TENANT",
    "DeadlinePolicy",
    "DecodeKVGate",
    "DecodeStepGate",
    "DecodeStepGateStats",
    "Draft",
    "DraftConfig",
    "DraftSource",
    "DrafterStats",
    "DuelingSLRU",
    "EDFRanker",
    "EvictionOrder",
    "EvictionStats",
    "FCFSOrder",
    "FairnessPolicy",
    "FrontendGate",
    "FrontendGateStats",
    "InstanceLoad",
    "InteractivePrefillGuard",
    "InvalidRequestMetadata",
    "KVBlockQuota",
    "KVWatermarks",
    "LRU",
    "LeastLoadedRouter",
    "LevelPolicy",
    "LifecycleObserver",
    "LoadAwareRanking",
    "LoadSnapshot",
    "MLFQ",
    "MLFQStats",
    "ManualClock",
    "OnlineStepTimeModel",
    "OutputLengths",
    "PDPlan",
    "PDPlanner",
    "PDRouter",
    "PDRouterStats",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "PathDelays",
    "PathDelaysStats",
    "Preemption",
    "PreemptionPolicy",
    "PrefillBudgetStats",
    "PrefillGuardStats",
    "PrefillLedger",
    "PrefillLedgerStats",
    "PrefixIndex",
    "PrefixWarmer",
    "PrefixWarmerStats",
    "PromptVersions",
    "QoSRanker",
    "QueueDepthLimit",
    "QuotaPolicy",
    "RankingPolicy",
    "RequestMetadata",
    "RequestView",
    "RetentionHints",
    "RoundRobinRouter",
    "RouteDecision",
    "RouteReason",
    "SLOAdmission",
    "SLOAdmissionStats",
    "SLODecision",
    "SLOTarget",
    "SLOVerdict",
    "Segment",
    "SegmentedLRU",
    "SessionGaps",
    "SessionHints",
    "SessionPins",
    "SharedCacheStats",
    "SharedSuffixCache",
    "SlotPreemption",
    "SlotPreemptionStats",
    "SpecMetrics",
    "SpecMetricsStats",
    "SpeculationBudget",
    "SpeculationBudgetStats",
    "SpeculationPolicy",
    "StartGate",
    "StepFeatures",
    "StepModelStats",
    "StepObserver",
    "StepPrefillBudget",
    "StepPrefillBudgetStats",
    "StepTimeModel",
    "SuffixAutomaton",
    "SuffixDrafter",
    "TTFTDeadlineRanker",
    "TenantPrefillBudget",
    "TenantQuota",
    "TenantUsage",
    "Tier",
    "TierMove",
    "TierPlacement",
    "TierStats",
    "TokenBucket",
    "TokenBucketStats",
    "TokenCapPolicy",
    "TokenCaps",
    "WFQ",
    "WFQStats",
    "WarmPrefix",
    "WarmingPolicy",
    "WatermarkLevel",
    "chain_keys",
    "parse_request_metadata",
]
