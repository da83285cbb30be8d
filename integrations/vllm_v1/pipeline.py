"""`Pipeline`: the policies one vLLM engine runs, composed in plain Python.

The engine-core process builds the scheduler itself, so the pipeline travels
to it inside ``vllm_config.additional_config`` (pickled, base64): any pipeline
made of importable classes reaches the engine, including one built in a
notebook.
"""

from __future__ import annotations

import base64
import pickle
from typing import TYPE_CHECKING, Any

import attrs

from policies import (
    AdmissionPolicy,
    DeadlinePolicy,
    FairnessPolicy,
    FCFSOrder,
    LevelPolicy,
    RankingPolicy,
    TenantQuota,
    TokenCapPolicy,
)
from policies.cache_warming import PrefixWarmer
from policies.eviction import EvictionOrder
from policies.pd_scheduling import DecodeKVGate
from policies.speculative import SpeculationBudget

if TYPE_CHECKING:
    from vllm import LLM

    from integrations.vllm_v1.pd_launch import PDDeployment
    from integrations.vllm_v1.server import LocalServer

CONFIG_KEY = "llm_serving_policies"
SCHEDULER_CLS = "integrations.vllm_v1.scheduler.PolicyScheduler"
ASYNC_SCHEDULER_CLS = "integrations.vllm_v1.scheduler.AsyncPolicyScheduler"
GATED_SCHEDULER_CLS = "integrations.vllm_v1.pd_scheduler.GatedPolicyScheduler"
ASYNC_GATED_SCHEDULER_CLS = "integrations.vllm_v1.pd_scheduler.AsyncGatedPolicyScheduler"


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
        default=None, validator=_implements(AdmissionPolicy, optional=True)
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
    ones (e.g. `EDFRanker`), whatever the ranking; ``None``: the ranking's, if it has them."""
    quotas: TenantQuota | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(TenantQuota))
    )
    """Per-tenant running-slot and KV-block quotas, work-conserving (`TenantQuota`); needs
    ``fairness``, which picks among the tenants under quota."""
    speculation: SpeculationBudget | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(SpeculationBudget)))
    """Caps each running request's draft tokens by class and load before a step (needs a
    ``speculative_config``; see `integrations.vllm_v1.spec_budget`)."""
    warming: PrefixWarmer | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(PrefixWarmer)))
    """Learns recurring prompt prefixes and pre-populates them while the engine is quiet
    (see `integrations.vllm_v1.cache_warming`)."""
    warming_state_path: str | None = None
    """Where ``warming`` keeps its hot prefixes across restarts (None: not kept)."""
    eviction: EvictionOrder | None = attrs.field(
        default=None, validator=_implements(EvictionOrder, optional=True)
    )
    """Which unreferenced prefix-cache block is evicted next (e.g. `SegmentedLRU`);
    ``None`` keeps vLLM's LRU (see `integrations.vllm_v1.eviction`)."""
    start_gate: DecodeKVGate | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(DecodeKVGate)),
    )
    """Holds waiting requests back while starting them would push KV usage past a bound
    (`DecodeKVGate`, for PD decode instances); runs in `GatedPolicyScheduler`."""

    def __attrs_post_init__(self) -> None:
        if self.quotas is not None and self.fairness is None:
            raise ValueError("Pipeline.quotas needs a fairness policy (e.g. WFQ) to pick among "
                             "the tenants under quota")

    @property
    def policies(self) -> tuple[object, ...]:
        """Every policy in the pipeline, in layer order."""
        slots = (self.fairness, self.ranking, self.levels, self.rate, self.admission,
                 self.watermarks, self.deadlines, self.quotas, self.speculation, self.warming)
        return tuple(p for p in slots if p is not None)

    @property
    def reorders_requests(self) -> bool:
        """Whether anything can reorder requests (FCFS ranking alone cannot)."""
        return (not isinstance(self.ranking, FCFSOrder) or self.levels is not None
                or self.fairness is not None)

    def to_additional_config(self) -> dict[str, Any]:
        """The ``additional_config`` entry that carries this pipeline to the engine."""
        blob = base64.b64encode(pickle.dumps(self)).decode("ascii")
        return {CONFIG_KEY: {"pipeline": blob}}

    @classmethod
    def from_additional_config(cls, additional_config: object) -> Pipeline:
        """The pipeline carried in ``additional_config``, or the identity pipeline if none."""
        entry = additional_config.get(CONFIG_KEY) if isinstance(additional_config, dict) else None
        if not entry:
            return cls()
        pipeline = pickle.loads(base64.b64decode(entry["pipeline"]))
        if not isinstance(pipeline, cls):
            raise TypeError(f"{CONFIG_KEY}.pipeline holds a {type(pipeline).__name__}")
        return pipeline

    def engine_kwargs(self, **engine_kwargs: Any) -> dict[str, Any]:
        """``engine_kwargs`` plus the scheduler class and this pipeline's config.

        Picks ``AsyncPolicyScheduler`` when the engine will schedule
        asynchronously (GPU default), else ``PolicyScheduler`` (their ``Gated`` variants
        from `integrations.vllm_v1.pd_scheduler` when ``start_gate`` is set).
        """
        if "scheduler_cls" in engine_kwargs:
            raise ValueError("scheduler_cls is set by the pipeline; do not pass it")
        additional = dict(engine_kwargs.pop("additional_config", None) or {})
        additional.update(self.to_additional_config())
        classes = ((ASYNC_SCHEDULER_CLS, SCHEDULER_CLS) if self.start_gate is None
                   else (ASYNC_GATED_SCHEDULER_CLS, GATED_SCHEDULER_CLS))
        return {
            **engine_kwargs,
            "scheduler_cls": classes[0] if _schedules_async(engine_kwargs) else classes[1],
            "additional_config": additional,
        }

    def llm(self, **engine_kwargs: Any) -> LLM:
        """A ``vllm.LLM`` whose scheduler runs this pipeline."""
        from vllm import LLM

        return LLM(**self.engine_kwargs(**engine_kwargs))

    def serve(self, model: str, *, host: str = "127.0.0.1", port: int = 8000,
              vllm_args: tuple[str, ...] = (), log_path: str | None = None) -> LocalServer:
        """Start vLLM's OpenAI server with this pipeline in a child process."""
        from integrations.vllm_v1.server import LocalServer

        return LocalServer.start(self, model, host=host, port=port, vllm_args=vllm_args,
                                 log_path=log_path)

    def serve_disaggregated(self, model: str, *, prefill: int = 1, decode: int = 1,
                            **options: Any) -> PDDeployment:
        """``prefill`` + ``decode`` vLLM servers running this pipeline with the PD-aware role
        presets, behind the PD router; returns once healthy (a context manager with ``url``).

        See `integrations.vllm_v1.pd_launch.serve_disaggregated` for ``options``.
        """
        from integrations.vllm_v1.pd_launch import serve_disaggregated

        return serve_disaggregated(self, model, prefill=prefill, decode=decode, **options)


def _schedules_async(engine_kwargs: dict[str, Any]) -> bool:
    if engine_kwargs.get("async_scheduling") is not None:
        return bool(engine_kwargs["async_scheduling"])
    from vllm.platforms import current_platform

    return not current_platform.is_cpu() and engine_kwargs.get("speculative_config") is None
