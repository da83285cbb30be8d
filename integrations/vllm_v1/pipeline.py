"""`Pipeline`: the policies one vLLM engine runs, composed in plain Python.

A pure value: it names policies and nothing else. How it reaches an engine
(`integrations.vllm_v1.config`), which scheduler runs it
(`integrations.vllm_v1.scheduling`) and how it is served
(`integrations.vllm_v1.serving`) live in their own packages.

A slot that an optional feature runs names its `SchedulerHook` in its own field metadata
(``metadata={HOOK: "package.module:factory"}``, called as ``factory(scheduler, policy)``
when the slot is set; a factory may return None when it has nothing to run for that
policy). The scheduler builds those hooks in field order (`hooked_slots`); the string keeps
this module free of the feature packages, and ``tests/test_layering.py`` resolves each one
and checks that the scheduler may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from policies import (
    AdmissionPolicy,
    DeadlinePolicy,
    FairnessPolicy,
    FCFSOrder,
    LevelPolicy,
    PreemptionPolicy,
    QuotaPolicy,
    RankingPolicy,
    SpeculationPolicy,
    StartGate,
    StepObserver,
    TokenCapPolicy,
    WarmingPolicy,
    needs_of,
)
from policies.kv.eviction import EvictionOrder

if TYPE_CHECKING:
    from integrations.vllm_v1.config.slo import SLOSpec

HOOK = "hook"
"""Field metadata key: the `SchedulerHook` factory that runs the slot (``package.module:name``)."""
DECLARATIONS = frozenset({"slo"})
"""Fields that say what the pipeline serves rather than hold a policy: not slots."""


def _implements(protocol: type, optional: bool = False):
    def check(_instance: object, attribute: attrs.Attribute, value: object) -> None:
        if value is None and optional:
            return
        if not isinstance(value, protocol):
            members = ", ".join(sorted(n for n in protocol.__dict__ if not n.startswith("_")))
            raise TypeError(
                f"Pipeline.{attribute.name} must implement {protocol.__name__} "
                f"({members}), got {type(value).__name__}"
            )

    return check


@attrs.frozen(kw_only=True)
class Pipeline:
    """The serving policies of one engine, in the four-layer order; every slot is optional.

    Waiting requests are ordered tenant first (``fairness`` picks whose queue is
    served), then by ``levels`` (MLFQ level), then by ``ranking``; ``rate`` caps
    prefill tokens per step; ``admission`` and then ``watermarks`` may reject a
    request on arrival. ``Pipeline()`` is the identity: it schedules exactly like
    stock vLLM ``fcfs``.
    """

    fairness: FairnessPolicy | None = attrs.field(
        default=None, validator=_implements(FairnessPolicy, optional=True)
    )
    """Which tenant's queue is served next (e.g. `WFQ`)."""
    ranking: RankingPolicy = attrs.field(factory=FCFSOrder, validator=_implements(RankingPolicy))
    """Order within a level (e.g. `QoSRanker`, `EDFRanker`); running victims come from the tail."""
    levels: LevelPolicy | None = attrs.field(
        default=None, validator=_implements(LevelPolicy, optional=True)
    )
    """Priority levels that move with service (e.g. `MLFQ`)."""
    rate: TokenCapPolicy | None = attrs.field(
        default=None, validator=_implements(TokenCapPolicy, optional=True)
    )
    """Caps the prefill tokens a request may be scheduled per step (e.g. `TokenBucket`)."""
    admission: AdmissionPolicy | None = attrs.field(
        default=None, validator=_implements(AdmissionPolicy, optional=True),
        metadata={HOOK: "integrations.vllm_v1.slo.admission_metrics:slo_admission_metrics"},
    )
    """Accepts or rejects each request on arrival (e.g. `AdmissionController`)."""
    watermarks: AdmissionPolicy | None = attrs.field(
        default=None, validator=_implements(AdmissionPolicy, optional=True)
    )
    """A second admission gate on KV-cache usage (e.g. `KVWatermarks`)."""
    deadlines: DeadlinePolicy | None = attrs.field(
        default=None, validator=_implements(DeadlinePolicy, optional=True)
    )
    """Drops waiting requests that can no longer meet their deadline and demotes late running
    ones (e.g. `EDFRanker`), whatever the ranking; ``None``: the ranking's, if its `Needs`
    ask for deadlines."""
    quotas: QuotaPolicy | None = attrs.field(
        default=None, validator=_implements(QuotaPolicy, optional=True)
    )
    """Per-tenant running-slot and KV-block quotas, work-conserving (`TenantQuota`); needs
    ``fairness``, which picks among the tenants under quota."""
    start_gate: StartGate | None = attrs.field(
        default=None, validator=_implements(StartGate, optional=True),
        metadata={HOOK: "integrations.vllm_v1.scheduling.start_gate:StartGateHook"},
    )
    """Holds waiting requests back while starting them would push the batch past a bound
    (`DecodeStepGate`: its predicted step time, `DecodeKVGate`: KV usage; for PD decode
    instances); see `integrations.vllm_v1.scheduling.start_gate`."""
    speculation: SpeculationPolicy | None = attrs.field(
        default=None, validator=_implements(SpeculationPolicy, optional=True),
        metadata={HOOK: "integrations.vllm_v1.speculative.budget:DraftBudgetHook"},
    )
    """Caps each running request's draft tokens by class and load before a step (needs a
    ``speculative_config``; see `integrations.vllm_v1.speculative.budget`)."""
    warming: WarmingPolicy | None = attrs.field(
        default=None, validator=_implements(WarmingPolicy, optional=True),
        metadata={HOOK: "integrations.vllm_v1.cache.warming:CacheWarmingHook"},
    )
    """Learns recurring prompt prefixes and pre-populates them while the engine is quiet
    (see `integrations.vllm_v1.cache.warming`)."""
    warming_state_path: str | None = None
    """Where ``warming`` keeps its hot prefixes across restarts (None: not kept)."""
    eviction: EvictionOrder | None = attrs.field(
        default=None, validator=_implements(EvictionOrder, optional=True),
        metadata={HOOK: "integrations.vllm_v1.cache.eviction:EvictionHook"},
    )
    """Which unreferenced prefix-cache block is evicted next (e.g. `SegmentedLRU`);
    ``None`` keeps vLLM's LRU (see `integrations.vllm_v1.cache.eviction`)."""
    step_model: StepObserver | None = attrs.field(
        default=None, validator=_implements(StepObserver, optional=True),
        metadata={HOOK: "integrations.vllm_v1.slo.step_timing:StepTimingHook"})
    """Learns the engine's step time from every step it runs (`OnlineStepTimeModel`); the
    policies that predict with it (`SLOAdmission`) hold the same object (see
    `integrations.vllm_v1.slo.step_timing`)."""
    preemption: PreemptionPolicy | None = attrs.field(
        default=None, validator=_implements(PreemptionPolicy, optional=True))
    """Preempts a running request for a more important waiting one once every slot is taken
    (`SlotPreemption`; vLLM itself preempts only for KV blocks). That request moves to the head
    of the queue and the victim waits right behind it; with ``fairness`` (which picks the
    tenant served next) only a request already at the head is served so."""

    slo: SLOSpec | None = None
    """The SLO declaration the pipeline serves (`slo_pipeline` sets it; None: none). The
    API server reads it from the pipeline it serves, however that pipeline was named (the
    ``slo`` preset, a pipeline built in Python): its door, class checks and headers follow
    it. Not a slot: the policies hold what they need of it."""

    def __attrs_post_init__(self) -> None:
        if self.quotas is not None and self.fairness is None:
            raise ValueError("Pipeline.quotas needs a fairness policy (e.g. WFQ) to pick among "
                             "the tenants under quota")

    @property
    def policies(self) -> tuple[object, ...]:
        """Every policy in the pipeline, one per set slot, in field order."""
        slots = (getattr(self, field.name) for field in attrs.fields(Pipeline)
                 if field.name != "warming_state_path" and field.name not in DECLARATIONS)
        return tuple(p for p in slots if p is not None)

    @property
    def deadline_policy(self) -> DeadlinePolicy | None:
        """``deadlines``, else the ranking if its `Needs` ask for deadlines (`EDFRanker`),
        else None."""
        if self.deadlines is not None:
            return self.deadlines
        return self.ranking if needs_of(self.ranking).deadlines else None

    @property
    def reorders_requests(self) -> bool:
        """Whether anything can reorder requests (the default ranking, `FCFSOrder()`, alone
        cannot)."""
        return (self.ranking != FCFSOrder() or self.levels is not None
                or self.fairness is not None)


def hooked_slots() -> tuple[tuple[str, str], ...]:
    """``(slot, hook factory path)`` of every `Pipeline` field that names a hook, in field
    order (the order the scheduler calls them in)."""
    return tuple((field.name, field.metadata[HOOK]) for field in attrs.fields(Pipeline)
                 if HOOK in field.metadata)
