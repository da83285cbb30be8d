"""The systems of the business case, each a fresh scheduler harness per run.

- ``fcfs`` and ``priority``: stock vLLM with its own queue policies.
- ``stock+queue-caps``: stock vLLM with its own frontend admission (``max_num_queued_reqs``
  / ``max_num_queued_tokens``) on ``fcfs`` or ``priority``, at the best setting of a sweep
  the study runs and reports (`benchmarks.replay.systems`); one setting is named
  ``stock+queue-caps:BASE[:reqs=N][:tokens=N]``.
- ``pipeline``: `business_pipeline`, the project's full composition without fixes.
- ``pipeline+fixes``: `fixes_pipeline`, the same pipeline with the fix policies in.
- ``pipeline+slo``: `slo_pipeline`, the product ``slo`` preset with the business case's SLO
  declaration: SLO-aware admission with earliest-deadline-first prefill, a per-step prefill
  bound and a step-time model learned online (the system the README leads with).
- ``pipeline+fixes+guard`` (on request only): `guarded_pipeline`, an ablation.

Pipelines hold stateful policies, so each run builds its own from these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from benchmarks.e2e_business_cases.slos import DEFINITIONS, PRIMARY
from benchmarks.e2e_business_cases.workload import tier_and_kind
from benchmarks.replay.enterprise import TENANTS
from benchmarks.replay.systems import QUEUE_CAPS
from benchmarks.replay.systems import build_system as build_replay_system
from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.presets import default_pipeline
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.config.slo import slo_pipeline as product_slo_pipeline
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from integrations.vllm_v1.pipeline import Pipeline
from policies import PRIORITY_MAX, EDFRanker, SLOTarget, TenantPrefillBudget, TokenCaps
from policies.rate.prefill_guard import InteractivePrefillGuard


def business_pipeline() -> Pipeline:
    """The pipeline without fixes: the ``default`` preset (`default_pipeline`).

    Tenant WFQ with the tier weights (Gold 4, Silver 2, Bronze 1: `TENANT_WEIGHTS`),
    QoS ranking, MLFQ levels, a prefill token bucket, queue-depth admission and KV
    watermarks.
    """
    return default_pipeline(TENANT_WEIGHTS)


def fixes_pipeline() -> Pipeline:
    """`business_pipeline` with the scheduling fixes that help here.

    3. prefill budget isolation: `TenantPrefillBudget` (tier weights), composed with
       the pipeline's token bucket through `TokenCaps`;
    5. overload management: ``deadlines=EDFRanker()`` drops a waiting request that
       can no longer meet its deadline (the QoS ranking stays), and the KV watermarks'
       YELLOW band no longer rejects by priority (``low_priority_from`` above
       `PRIORITY_MAX`): in the overload it rejected 92-96 % of the Bronze tenants'
       requests while Gold and Silver were admitted. The RED band and queue-depth
       admission still bound the load.

    Fix 4, `TenantQuota` (``quotas=TenantQuota(weights=TENANT_WEIGHTS)``), is left
    out: measured in this study it made Gold slower in the overload phase (see the docs).
    """
    pipeline = business_pipeline()
    budget = TenantPrefillBudget(weights=TENANT_WEIGHTS)
    watermarks = attrs.evolve(pipeline.watermarks, low_priority_from=PRIORITY_MAX + 1)
    return attrs.evolve(pipeline, rate=TokenCaps(policies=(pipeline.rate, budget)),
                        deadlines=EDFRanker(), watermarks=watermarks)


def guarded_pipeline() -> Pipeline:
    """`fixes_pipeline` plus `InteractivePrefillGuard`: a long prompt's prefill chunk is held
    to 1,024 tokens while a short prompt has prefill outstanding (an ablation, not a default:
    short prompts gain, long ones lose; see the docs)."""
    pipeline = fixes_pipeline()
    return attrs.evolve(pipeline, rate=TokenCaps(policies=(*pipeline.rate.policies,
                                                          InteractivePrefillGuard())))


def slo_targets(definition: str = PRIMARY) -> dict[str, SLOTarget]:
    """The business case's SLOs (`slos.DEFINITIONS`) as the policies' `SLOTarget` objects."""
    return {cls: SLOTarget(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s)
            for cls, slo in DEFINITIONS[definition].items()}


def slo_spec() -> SLOSpec:
    """What the operator of the business case declares to the ``slo`` preset: its SLO classes
    (``<tier>-<kind>``, `slos.DEFINITIONS`), every request naming its own, each tenant allowed
    its own tier's classes (so that, served over HTTP, a Gold tenant may claim the protected
    Gold classes at the door), and the Gold classes protected. Nothing else: no step model,
    no tuned constant."""
    classes = slo_targets()
    allowed = {tenant.name: frozenset(cls for cls in classes
                                      if tier_and_kind(cls)[0] == tenant.tier)
               for tenant in TENANTS}
    return SLOSpec(classes=classes, by_prompt_tokens=(), allowed=allowed,
                   protected=frozenset(cls for cls in classes if cls.startswith("gold-")))


def slo_pipeline() -> Pipeline:
    """The product ``slo`` preset (`integrations.vllm_v1.config.slo.slo_pipeline`) with the
    business case's declaration (`slo_spec`): EDF on first-token deadlines, SLO admission,
    a per-step prefill bound, and a step-time model learned online from the engine's steps."""
    return product_slo_pipeline(slo_spec())


PIPELINES: Mapping[str, Callable[[], Pipeline]] = {
    "pipeline": business_pipeline,
    "pipeline+fixes": fixes_pipeline,
    "pipeline+slo": slo_pipeline,
    "pipeline+fixes+guard": guarded_pipeline,
}
STOCK = ("fcfs", "priority", QUEUE_CAPS)
"""The stock vLLM systems, the peers every target is judged against."""
SYSTEMS: tuple[str, ...] = (*STOCK, "pipeline", "pipeline+fixes", "pipeline+slo")
"""The systems a study runs by default, in table order (``--systems`` also takes every name in
`PIPELINES` and ``stock+queue-caps:BASE[:reqs=N][:tokens=N]``)."""
HEADLINE = "pipeline+slo"
"""The system the README leads with."""


def build_system(name: str, shape: EngineShape) -> SchedulerHarness:
    """A fresh harness for one of `SYSTEMS` (or one ``stock+queue-caps:...`` setting) over an
    engine of ``shape``; plain ``stock+queue-caps`` is a sweep (`study.run_study`).

    Raises:
        ValueError: for an unknown name.
    """
    if name in PIPELINES:
        return SchedulerHarness.build(PIPELINES[name](), shape=shape)
    if name in ("fcfs", "priority") or name.startswith(QUEUE_CAPS):
        return build_replay_system(name, shape)
    raise ValueError(f"unknown system {name!r}: use one of {', '.join((*STOCK, *PIPELINES))}")
