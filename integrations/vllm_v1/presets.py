"""Named pipelines, and resolution of ``NAME``, ``module:attr`` or ``path.py:attr``."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

from integrations.vllm_v1.pd_presets import PD_DECODE, PD_PREFILL
from integrations.vllm_v1.pipeline import Pipeline
from policies import (
    MLFQ,
    WFQ,
    AdmissionController,
    CacheAwareRanker,
    EDFRanker,
    KVWatermarks,
    QoSRanker,
    SegmentedLRU,
    TokenBucket,
)

TENANT_WEIGHTS = {
    # `--tenants servegen` tiers (benchmarks.replay): Gold t0-t1, Silver t2-t4, Bronze t5-t6
    "t0": 4.0, "t1": 4.0, "t2": 2.0, "t3": 2.0, "t4": 2.0, "t5": 1.0, "t6": 1.0,
    # the `enterprise` workload's tenants
    "acme-bank": 4.0, "globex-health": 4.0, "initech": 2.0, "umbrella": 2.0, "hooli": 2.0,
    "piedpiper": 1.0, "vandelay": 1.0,
}
"""Gold 4, Silver 2, Bronze 1 for the tenants of the built-in workloads; others weigh 1."""


def default_pipeline() -> Pipeline:
    """The four-layer composition: tenant WFQ -> QoS ranking -> MLFQ -> token bucket,
    with admission control and KV watermarks around them."""
    return Pipeline(
        fairness=WFQ(weights=TENANT_WEIGHTS),
        ranking=QoSRanker(),
        levels=MLFQ(),
        rate=TokenBucket(capacity_tokens=2048, min_refill_per_s=2048.0,
                         max_refill_per_s=16384.0, unlimited_priority_at_most=0),
        admission=AdmissionController(max_waiting=2048, red_min_waiting=1024,
                                      red_max_waiting=2048, rng=random.Random(0)),
        watermarks=KVWatermarks(),
    )


PRESETS: dict[str, Pipeline] = {
    "identity": Pipeline(),
    "qos": Pipeline(ranking=QoSRanker()),
    "default": default_pipeline(),
    "wfq": Pipeline(fairness=WFQ(weights=TENANT_WEIGHTS)),
    "mlfq": Pipeline(levels=MLFQ()),
    "edf": Pipeline(ranking=EDFRanker()),
    "rate": Pipeline(rate=TokenBucket(capacity_tokens=2048, min_refill_per_s=2048.0,
                                      max_refill_per_s=16384.0, unlimited_priority_at_most=0)),
    "admission": Pipeline(admission=AdmissionController(
        max_waiting=2048, red_min_waiting=1024, red_max_waiting=2048, rng=random.Random(0))),
    "watermarks": Pipeline(watermarks=KVWatermarks()),
    "slru": Pipeline(eviction=SegmentedLRU()),
    "cache": Pipeline(eviction=SegmentedLRU(), ranking=CacheAwareRanker()),
    "pd-prefill": PD_PREFILL.pipeline,
    "pd-decode": PD_DECODE.pipeline,
}
"""Built-in pipelines by name. ``identity`` schedules like stock ``fcfs``; ``default`` is the
full composition; ``cache`` is the KV-cache pair (segmented LRU eviction, cache-aware
ranking); ``pd-prefill`` / ``pd-decode`` are the PD-aware role pipelines
(`integrations.vllm_v1.pd_presets`, which also sets their engine limits); the others are
one policy alone, for ablations. Each engine unpickles its
own copy, so stateful policies are never shared between engines."""


def resolve_pipeline(spec: str) -> Pipeline:
    """The pipeline named by ``spec``: a preset name, ``pkg.module:attr`` or ``file.py:attr``.

    Raises:
        ValueError: if nothing by that name exists or it is not a `Pipeline`.
    """
    if spec in PRESETS:
        return PRESETS[spec]
    if ":" not in spec:
        raise ValueError(f"unknown pipeline {spec!r}: use one of {sorted(PRESETS)}, "
                         "'package.module:attr' or 'path/to/file.py:attr'")
    location, attr = spec.rsplit(":", 1)
    if location.endswith(".py"):
        path = Path(location).resolve()
        if not path.is_file():
            raise ValueError(f"pipeline file not found: {location}")
        # Import it as a real module from its folder, so policies defined in the file
        # pickle by reference and the engine process (which inherits sys.path) finds them.
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        location = path.stem
    module = importlib.import_module(location)
    pipeline = getattr(module, attr, None)
    if not isinstance(pipeline, Pipeline):
        raise ValueError(f"{spec} is not a Pipeline (got {type(pipeline).__name__})")
    return pipeline
