"""Named pipelines: each preset is a factory, so every engine gets fresh policy state.

A preset that weighs tenants (``default``, ``wfq``) takes the weights as an
argument: the library knows no tenant names. Unlisted tenants weigh 1.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.pd_roles import pd_decode_pipeline, pd_prefill_pipeline
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.pipeline import Pipeline
from policies import (
    MLFQ,
    WFQ,
    AdmissionController,
    CacheAwareRanker,
    DuelingSLRU,
    EDFRanker,
    KVWatermarks,
    QoSRanker,
    SegmentedLRU,
    SessionPins,
    TokenBucket,
)

TenantWeights = Mapping[str, float]
PresetFactory = Callable[[TenantWeights], Pipeline]


def default_rate() -> TokenBucket:
    """The ``default`` preset's token bucket: 2,048-token bursts, 2k-16k tokens/s refill,
    priority 0 unlimited."""
    return TokenBucket(capacity_tokens=2048, min_refill_per_s=2048.0,
                       max_refill_per_s=16384.0, unlimited_priority_at_most=0)


def default_admission() -> AdmissionController:
    """The ``default`` preset's admission: at most 2,048 waiting, early drop from 1,024."""
    return AdmissionController(max_waiting=2048, red_min_waiting=1024, red_max_waiting=2048,
                               rng=random.Random(0))


def default_pipeline(tenant_weights: TenantWeights = {}) -> Pipeline:  # noqa: B006 - read only
    """The four-layer composition: tenant WFQ -> QoS ranking -> MLFQ -> token bucket,
    with admission control and KV watermarks around them."""
    return Pipeline(fairness=WFQ(weights=dict(tenant_weights)), ranking=QoSRanker(),
                    levels=MLFQ(), rate=default_rate(), admission=default_admission(),
                    watermarks=KVWatermarks())


PRESETS: Mapping[str, PresetFactory] = {
    "identity": lambda _weights: Pipeline(),
    "qos": lambda _weights: Pipeline(ranking=QoSRanker()),
    "default": default_pipeline,
    "wfq": lambda weights: Pipeline(fairness=WFQ(weights=dict(weights))),
    "mlfq": lambda _weights: Pipeline(levels=MLFQ()),
    "edf": lambda _weights: Pipeline(ranking=EDFRanker()),
    "rate": lambda _weights: Pipeline(rate=default_rate()),
    "admission": lambda _weights: Pipeline(admission=default_admission()),
    "watermarks": lambda _weights: Pipeline(watermarks=KVWatermarks()),
    "slru": lambda _weights: Pipeline(eviction=SegmentedLRU()),
    "cache": lambda _weights: Pipeline(eviction=DuelingSLRU(session_pins=SessionPins()),
                                       ranking=CacheAwareRanker()),
    "slo": lambda _weights: slo_pipeline(),
    "pd-prefill": lambda _weights: pd_prefill_pipeline(),
    "pd-decode": lambda _weights: pd_decode_pipeline(),
}
"""Built-in pipeline factories by name. ``identity`` schedules like stock ``fcfs``;
``default`` is the full composition; ``slo`` serves declared SLO classes (EDF, SLO
admission, decode protection, a step model learned online: `integrations.vllm_v1.config.slo`;
its classes come from ``llm_serving_policies.slo``); ``cache`` is the KV-cache pair (segmented LRU
that turns into LRU where frequency does not pay, with session pins; cache-aware ranking); ``pd-prefill`` / ``pd-decode`` are the PD-aware role
pipelines (`integrations.vllm_v1.config.pd_roles`, which also sets their engine limits); the
others are one policy alone, for ablations."""


def preset(name: str, tenant_weights: TenantWeights = {},  # noqa: B006 - read only
           slo: object = None) -> Pipeline:
    """A fresh pipeline of the preset ``name``; ``slo`` is the ``slo`` preset's declaration
    (`SLOSpec.parse`).

    Raises:
        ValueError: if there is no such preset, or ``slo`` is given to another preset
            (`PipelineConfigError`, naming the field).
    """
    factory = PRESETS.get(name)
    if factory is None:
        raise ValueError(f"unknown pipeline preset {name!r}: use one of {sorted(PRESETS)}")
    if name == "slo":
        return slo_pipeline(SLOSpec.parse(slo))
    if slo is not None:
        raise PipelineConfigError(f"llm_serving_policies.slo is read by the slo preset only, "
                                  f"not by {name!r}")
    return factory(tenant_weights)
