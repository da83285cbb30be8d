"""Named pipelines: each preset is a factory, so every engine gets fresh policy state.

Every factory takes the whole ``llm_serving_policies`` entry (`PresetEntry`) and reads what
it needs: a preset that weighs tenants (``default``, ``wfq``) reads ``tenant_weights`` (the
library knows no tenant names; unlisted tenants weigh 1), the ``slo`` preset its ``slo``
declaration. A declaration no preset of that name reads is an error naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs

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


@attrs.frozen(kw_only=True)
class PresetEntry:
    """The ``llm_serving_policies`` entry a preset is built from (the keys beside
    ``pipeline``)."""

    tenant_weights: TenantWeights = attrs.field(factory=dict)
    """Tenant -> weight, for the presets that weigh tenants (the others ignore them)."""
    slo: Any = None
    """The ``slo`` declaration as given (`SLOSpec.parse` reads it); None: not declared."""

    def declared(self) -> frozenset[str]:
        """The keys that must be read by the preset they are given to."""
        return frozenset({"slo"} if self.slo is not None else ())


@attrs.frozen
class Preset:
    """A pipeline factory and the declarations of `PresetEntry.declared` it reads."""

    build: Callable[[PresetEntry], Pipeline]
    reads: frozenset[str] = frozenset()

    def __call__(self, entry: PresetEntry) -> Pipeline:
        """A fresh pipeline for ``entry``."""
        return self.build(entry)



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


PRESETS: Mapping[str, Preset] = {
    "identity": Preset(lambda _entry: Pipeline()),
    "qos": Preset(lambda _entry: Pipeline(ranking=QoSRanker())),
    "default": Preset(lambda entry: default_pipeline(entry.tenant_weights)),
    "wfq": Preset(lambda entry: Pipeline(fairness=WFQ(weights=dict(entry.tenant_weights)))),
    "mlfq": Preset(lambda _entry: Pipeline(levels=MLFQ())),
    "edf": Preset(lambda _entry: Pipeline(ranking=EDFRanker())),
    "rate": Preset(lambda _entry: Pipeline(rate=default_rate())),
    "admission": Preset(lambda _entry: Pipeline(admission=default_admission())),
    "watermarks": Preset(lambda _entry: Pipeline(watermarks=KVWatermarks())),
    "slru": Preset(lambda _entry: Pipeline(eviction=SegmentedLRU())),
    "cache": Preset(lambda _entry: Pipeline(eviction=DuelingSLRU(session_pins=SessionPins()),
                                            ranking=CacheAwareRanker())),
    "slo": Preset(lambda entry: slo_pipeline(SLOSpec.parse(entry.slo)), reads=frozenset({"slo"})),
    "pd-prefill": Preset(lambda _entry: pd_prefill_pipeline()),
    "pd-decode": Preset(lambda _entry: pd_decode_pipeline()),
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
    """A fresh pipeline of the preset ``name``, built from the entry of ``tenant_weights``
    and ``slo`` (the ``slo`` preset's declaration, `SLOSpec.parse`).

    Raises:
        ValueError: if there is no such preset, or a declaration is given to a preset that
            does not read it, such as ``slo`` to another preset (`PipelineConfigError`,
            naming the key).
    """
    factory = PRESETS.get(name)
    if factory is None:
        raise ValueError(f"unknown pipeline preset {name!r}: use one of {sorted(PRESETS)}")
    entry = PresetEntry(tenant_weights=tenant_weights, slo=slo)
    unread = sorted(entry.declared() - factory.reads)
    if unread:
        key = unread[0]
        readers = " and ".join(sorted(n for n, p in PRESETS.items() if key in p.reads))
        raise PipelineConfigError(f"llm_serving_policies.{key} is read by the {readers} preset "
                                  f"only, not by {name!r}")
    return factory(entry)
