"""The four systems of the business case, each a fresh scheduler harness per run.

- ``fcfs`` and ``priority``: stock vLLM with its own queue policies.
- ``pipeline``: `business_pipeline`, the project's full composition without fixes.
- ``pipeline+fixes``: `fixes_pipeline`, the same pipeline with the fix policies in.
- ``pipeline+fixes+guard`` (on request only): `guarded_pipeline`, an ablation.

Pipelines hold stateful policies, so each run builds its own from these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from benchmarks.replay.driver import build_harness
from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.presets import default_pipeline
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from integrations.vllm_v1.pipeline import Pipeline
from policies import PRIORITY_MAX, EDFRanker, TenantPrefillBudget, TokenCaps
from policies.prefill_guard import InteractivePrefillGuard


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


PIPELINES: Mapping[str, Callable[[], Pipeline]] = {
    "pipeline": business_pipeline,
    "pipeline+fixes": fixes_pipeline,
    "pipeline+fixes+guard": guarded_pipeline,
}
SYSTEMS: tuple[str, ...] = ("fcfs", "priority", "pipeline", "pipeline+fixes")
"""The systems a study runs by default, in table order (``--systems`` also takes every name in
`PIPELINES`)."""


def build_system(name: str, shape: EngineShape) -> SchedulerHarness:
    """A fresh harness for one of `SYSTEMS` over an engine of ``shape``.

    Raises:
        ValueError: for a name not in `SYSTEMS`.
    """
    if name in PIPELINES:
        return SchedulerHarness.build(PIPELINES[name](), shape=shape)
    if name in SYSTEMS:
        return build_harness(name, shape)
    raise ValueError(f"unknown system {name!r}: use one of {', '.join((*SYSTEMS[:2], *PIPELINES))}")
