"""Per-phase metrics of one system's run: the `benchmarks.replay.metrics` summaries, by phase.

A request belongs to the phase its arrival falls in, wherever it is served.
Latency, SLO, goodput, fairness and cache figures come from
`benchmarks.replay.metrics.latency_summary` over a phase's requests (goodput
per second of the phase); this module only groups records and adds the
admission accounting and the queue-length maximum.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from benchmarks.e2e_business_cases.workload import BusinessWorkload, is_short
from benchmarks.replay.fair_share import fair_share_jain
from benchmarks.replay.metrics import SLO, latency_summary
from benchmarks.replay.records import EngineSample, RequestRecord, SystemRun
from integrations.vllm_v1.rejection import Rejection

TIERS = ("gold", "silver", "bronze")


def admission_counts(records: Sequence[RequestRecord], offered: int) -> dict:
    """Offered, admitted, rejected (by reason) and whether every rejection says Retry-After.

    ``admitted`` counts requests that were not rejected (completed or
    cancelled); ``conserved`` is ``admitted + rejected == offered`` with
    ``offered`` counted from the trace, not the records. A rejection has a
    Retry-After when its reason reads ``rejected:<reason>;retry_after_s=<s>``,
    which the HTTP layer turns into the header.
    """
    rejected = [r for r in records if r.outcome == "rejected"]
    admitted = sum(r.outcome in ("completed", "cancelled") for r in records)
    parsed = [Rejection.parse(r.reason) for r in rejected]
    with_retry = sum(rejection is not None for rejection in parsed)
    reasons = Counter(rejection.reason if rejection else r.reason.removeprefix("rejected:")
                      for r, rejection in zip(rejected, parsed, strict=True))
    return {
        "offered": offered,
        "admitted": admitted,
        "rejected": len(rejected),
        "completed": sum(r.outcome == "completed" for r in records),
        "cancelled": sum(r.outcome == "cancelled" for r in records),
        "rejections_by_reason": dict(sorted(reasons.items())),
        "rejections_with_retry_after": with_retry,
        "all_rejections_have_retry_after": with_retry == len(rejected),
        "conserved": admitted + len(rejected) == offered,
    }


def _p99(records: Iterable[RequestRecord], slos: Mapping[str, SLO], duration_s: float) -> float:
    return latency_summary(records, slos, duration_s)["ttft_p99_s"]


def slo_figures(records: Sequence[RequestRecord], slos: Mapping[str, SLO],
                duration_s: float) -> dict:
    """SLO attainment (of all offered), goodput (SLO-meeting req/s) and the share of the
    admitted requests meeting their SLO (cancelled ones count as missing; and without the
    ones the client cancelled before they were late), under ``slos``."""
    summary = latency_summary(records, slos, duration_s)
    return {key: summary[key] for key in ("slo_attainment", "goodput_rps",
                                          "admitted_slo_attainment",
                                          "admitted_slo_attainment_uncancelled")}


def phase_metrics(records: Sequence[RequestRecord], samples: Sequence[EngineSample], *,
                  workload: BusinessWorkload, index: int, offered: int,
                  slos: Mapping[str, SLO],
                  definitions: Mapping[str, Mapping[str, SLO]] | None = None) -> dict:
    """Metrics of the requests that arrived in phase ``index`` (see the module docstring).

    ``jain_index`` is Jain's index over the backlogged tenants' tier-weighted
    service (`benchmarks.replay.metrics.fairness`, 10 s windows);
    ``fair_share_jain`` Jain's index of each tenant's served tokens over its
    weighted max-min fair share of the phase (`benchmarks.replay.fair_share`);
    ``queue_len_max`` is the longest waiting queue sampled during the phase.
    SLO figures are under ``slos``; ``by_definition`` has them (`slo_figures`) under each of
    ``definitions`` as well, by name.
    """
    phase_s, tiers = workload.phase_s, workload.tiers
    overall = latency_summary(records, slos, phase_s, workload.weights)
    by_tier = {tier: latency_summary([r for r in records if tiers[r.tenant] == tier], slos,
                                     phase_s, workload.weights) for tier in TIERS}
    short = [r for r in records if is_short(r.prompt_tokens)]
    start_s, end_s = index * phase_s, (index + 1) * phase_s
    queue = [s.waiting for s in samples if start_s <= s.time_s < end_s]
    switched = [r for r in records if r.tenant == workload.switch_tenant]
    return {
        **admission_counts(records, offered),
        "gold_short_ttft_p99_s": _p99([r for r in short if tiers[r.tenant] == "gold"], slos,
                                      phase_s),
        "short_ttft_p99_s": _p99(short, slos, phase_s),
        "ttft_p99_s": overall["ttft_p99_s"],
        "ttft_p99_s_by_tier": {t: s["ttft_p99_s"] for t, s in by_tier.items()},
        "slo_attainment_by_tier": {t: s["slo_attainment"] for t, s in by_tier.items()},
        "slo_attainment": overall["slo_attainment"],
        "goodput_rps": overall["goodput_rps"],
        "admitted_slo_attainment": overall["admitted_slo_attainment"],
        "admitted_slo_attainment_uncancelled": overall["admitted_slo_attainment_uncancelled"],
        "cancelled_on_time": overall["cancelled_on_time"],
        "admitted_slo_attainment_by_tier": {t: s["admitted_slo_attainment"]
                                            for t, s in by_tier.items()},
        "by_definition": {name: slo_figures(records, definition, phase_s)
                          for name, definition in (definitions or {}).items()},
        "jain_index": overall["jain_index"],
        "fair_share_jain": fair_share_jain(records, weights=workload.weights),
        "prefix_hit_rate": overall["prefix_hit_rate"],
        "switch_tenant_hit_rate": latency_summary(switched, slos, phase_s)["prefix_hit_rate"],
        "preemptions": overall["preemptions"],
        "queue_len_max": max(queue, default=None),
        "by_tier": by_tier,
    }


def hit_rate_series(records: Iterable[RequestRecord], *, bin_s: float,
                    tenant: str | None = None) -> list[list[float]]:
    """``[bin midpoint s, prefix hit rate]`` per ``bin_s`` of arrival time, non-rejected only.

    The hit rate is cached prompt tokens over prompt tokens of the requests that
    arrived in the bin (of ``tenant`` only, if given); bins without one are left out.
    """
    cached: Counter[int] = Counter()
    prompt: Counter[int] = Counter()
    for r in records:
        if r.outcome != "rejected" and (tenant is None or r.tenant == tenant):
            cached[int(r.arrival_s // bin_s)] += r.cached_tokens
            prompt[int(r.arrival_s // bin_s)] += r.prompt_tokens
    return [[(b + 0.5) * bin_s, cached[b] / prompt[b]] for b in sorted(prompt)]


def run_phases(run: SystemRun, workload: BusinessWorkload, slos: Mapping[str, SLO],
               definitions: Mapping[str, Mapping[str, SLO]] | None = None) -> list[dict]:
    """`phase_metrics` of every phase of one run, in phase order."""
    grouped: list[list[RequestRecord]] = [[] for _ in workload.phases]
    for record in run.records:
        grouped[workload.phase_index(record.arrival_s)].append(record)
    offered = Counter(workload.phase_index(r.arrival_s) for r in workload.trace.requests)
    return [phase_metrics(records, run.samples, workload=workload, index=i, offered=offered[i],
                          slos=slos, definitions=definitions)
            for i, records in enumerate(grouped)]
