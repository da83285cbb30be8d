"""Summaries of a replay: latency percentiles, SLOs, goodput, fairness, cache and preemption.

Everything is computed from `RequestRecord`s; definitions follow BENCHMARKS.md §1.
Every request counts in its prompt-length class (``short`` below
`SHORT_PROMPT_TOKENS`, ``long`` otherwise) and, when the trace gives one, in its
``slo_class`` too; SLOs are judged by the SLO class, else the length class.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

import attrs
import numpy as np

from benchmarks.replay.records import RequestRecord, SystemRun
from policies.percentile import percentile

SHORT_PROMPT_TOKENS = 512


@attrs.frozen
class SLO:
    """Latency targets one request must meet: first token within ``ttft_s``, then ``tpot_s``."""

    ttft_s: float
    tpot_s: float


DEFAULT_SLOS: Mapping[str, SLO] = {
    "short": SLO(ttft_s=0.5, tpot_s=0.1),
    "long": SLO(ttft_s=5.0, tpot_s=0.1),
    "gold": SLO(ttft_s=0.5, tpot_s=0.05),
    "silver": SLO(ttft_s=2.0, tpot_s=0.1),
    "bronze": SLO(ttft_s=10.0, tpot_s=0.2),
}
"""Default per-class targets (Llama-3-8B-class serving); override per run."""


def length_class(record: RequestRecord) -> str:
    """``short`` below `SHORT_PROMPT_TOKENS` prompt tokens, else ``long``."""
    return "short" if record.prompt_tokens < SHORT_PROMPT_TOKENS else "long"


def request_class(record: RequestRecord) -> str:
    """The record's SLO class, or its prompt-length class when it has none."""
    return record.slo_class or length_class(record)


def _pct(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def meets_slo(record: RequestRecord, slos: Mapping[str, SLO]) -> bool:
    """Completed, first token within the class TTFT and mean TPOT within the class TPOT."""
    slo = slos.get(request_class(record))
    if record.outcome != "completed" or slo is None or record.ttft_s is None:
        return False
    return record.ttft_s <= slo.ttft_s and (record.tpot_s or 0.0) <= slo.tpot_s


def _late_when_cancelled(record: RequestRecord, slos: Mapping[str, SLO]) -> bool:
    """Whether a cancelled request had already missed its TTFT target when it was cancelled."""
    slo = slos.get(request_class(record))
    if slo is None:
        return True
    first = record.token_times_s[0] if record.token_times_s else record.finish_s
    return first is None or first - record.arrival_s > slo.ttft_s


def latency_summary(records: Iterable[RequestRecord], slos: Mapping[str, SLO],
                    duration_s: float, weights: Mapping[str, float] | None = None) -> dict:
    """Counts, TTFT/TPOT/ITL/E2E percentiles, SLO attainment, goodput, cache and fairness.

    ``slo_attainment`` is the share of all requests (rejected ones count as missing) that met
    their SLO (`meets_slo`), ``goodput_rps`` those per second; ``admitted_slo_attainment``
    the share of the admitted ones (not rejected; a cancelled request never meets its SLO);
    ``admitted_slo_attainment_uncancelled`` the same without the requests the client
    cancelled before they were late (no first token past the TTFT target), which the engine
    could not have served in full (``cancelled_on_time`` counts them).
    """
    records = list(records)
    done = [r for r in records if r.outcome == "completed"]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    gaps = [b - a for r in done for a, b in zip(r.token_times_s, r.token_times_s[1:],
                                                  strict=False)]
    itl_p50, itl_p99 = _pct(gaps, 50), _pct(gaps, 99)
    meeting = sum(meets_slo(r, slos) for r in records)
    served = [r for r in records if r.outcome != "rejected"]
    late_cancels = sum(r.outcome == "cancelled" and _late_when_cancelled(r, slos) for r in served)
    judged = sum(r.outcome == "completed" for r in served) + late_cancels
    return {
        "offered": len(records),
        "completed": len(done),
        "rejected": sum(r.outcome == "rejected" for r in records),
        "cancelled": sum(r.outcome == "cancelled" for r in records),
        "cancelled_on_time": sum(r.outcome == "cancelled" for r in served) - late_cancels,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p99_s": _pct(tpot, 99),
        "itl_p50_s": itl_p50,
        "itl_p99_s": itl_p99,
        "itl_jitter": itl_p99 / itl_p50 if itl_p50 else None,
        "e2e_p99_s": _pct([r.e2e_s for r in done], 99),
        "slo_attainment": meeting / len(records) if records else None,
        "admitted_slo_attainment": meeting / len(served) if served else None,
        "admitted_slo_attainment_uncancelled": meeting / judged if judged else None,
        "goodput_rps": meeting / duration_s if duration_s > 0 else None,
        "prefix_hit_rate": (sum(r.cached_tokens for r in served)
                            / max(1, sum(r.prompt_tokens for r in served))),
        "preemptions": sum(r.preemptions for r in records),
        "recomputed_tokens": sum(r.recomputed_tokens for r in records),
        "jain_index": fairness(records, weights=weights)["jain_mean"],
    }


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value takes everything."""
    xs = np.asarray(list(values), dtype=float)
    total = float((xs**2).sum())
    return float(xs.sum() ** 2 / (len(xs) * total)) if total > 0 else 1.0


def fairness(records: Iterable[RequestRecord], *, weights: Mapping[str, float] | None = None,
             window_s: float = 10.0) -> dict:
    """Jain's index over per-tenant weighted service, in windows where ≥ 2 tenants are backlogged.

    A tenant is backlogged in a window if one of its requests is queued (arrived,
    not yet scheduled) at the window's midpoint — it wants more service than it
    gets, as in VTC; its service is the prompt tokens of its requests whose first
    token falls in the window plus the output tokens emitted in it, divided by its
    weight (default 1).
    """
    records = [r for r in records if r.outcome == "completed" and r.token_times_s]
    tenants = sorted({r.tenant for r in records})
    if len(tenants) < 2:
        return {"jain_mean": None, "jain_min": None, "max_min_share_ratio": None, "windows": 0}
    count = int(max(r.finish_s for r in records) // window_s) + 1
    mids = (np.arange(count) + 0.5) * window_s
    service = np.zeros((len(tenants), count))
    backlogged = np.zeros((len(tenants), count), dtype=bool)
    row = {tenant: i for i, tenant in enumerate(tenants)}
    for r in records:
        i = row[r.tenant]
        service[i, int(r.token_times_s[0] // window_s)] += r.prompt_tokens
        np.add.at(service[i], (np.asarray(r.token_times_s) // window_s).astype(int), 1)
        backlogged[i] |= (r.arrival_s <= mids) & (mids < r.first_scheduled_s)
    weight = np.array([(weights or {}).get(t, 1.0) for t in tenants])[:, None]
    shares = service / weight
    jains, ratios = [], []
    for w in np.flatnonzero(backlogged.sum(axis=0) >= 2):
        active = shares[backlogged[:, w], w]
        jains.append(jain_index(active))
        if active.min() > 0:
            ratios.append(active.max() / active.min())
    return {
        "jain_mean": float(np.mean(jains)) if jains else None,
        "jain_min": float(np.min(jains)) if jains else None,
        "max_min_share_ratio": float(np.mean(ratios)) if ratios else None,
        "windows": len(jains),
    }


def summarize(run: SystemRun, *, slos: Mapping[str, SLO] = DEFAULT_SLOS,
              weights: Mapping[str, float] | None = None) -> dict:
    """Overall, per-class and per-tenant metrics of one system's replay.

    Conservation holds by construction of the replay: ``offered == completed +
    rejected + cancelled``. ``goodput_rps`` divides the requests meeting their SLO by the
    run's makespan, which a few long answers' drain can set on its own (a system that serves
    them in bigger batches finishes later); ``goodput_arrival_window_rps`` divides them by the
    arrival window instead, the same for every system of a run (so it ranks by ``met_slo``).
    """
    arrivals = [r.arrival_s for r in run.records]
    duration = run.makespan_s - min(arrivals, default=0.0)
    window = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    met = sum(meets_slo(r, slos) for r in run.records)
    by_class: dict[str, list[RequestRecord]] = defaultdict(list)
    by_tenant: dict[str, list[RequestRecord]] = defaultdict(list)
    by_priority: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in run.records:
        by_class[length_class(record)].append(record)
        if record.slo_class:
            by_class[record.slo_class].append(record)
        by_tenant[record.tenant].append(record)
        by_priority[record.priority].append(record)
    overall = latency_summary(run.records, slos, duration, weights)
    rejections = [r.reason for r in run.records if r.outcome == "rejected"]
    reasons = Counter(reason.split(";")[0] for reason in rejections)
    return {
        "system": run.system,
        "offered": overall["offered"],
        "completed": overall["completed"],
        "rejected": overall["rejected"],
        "cancelled": overall["cancelled"],
        "overall": overall,
        "by_class": {k: latency_summary(v, slos, duration, weights)
                     for k, v in sorted(by_class.items())},
        "by_tenant": {k: latency_summary(v, slos, duration, weights)
                      for k, v in sorted(by_tenant.items())},
        "by_priority": {str(k): latency_summary(v, slos, duration, weights)
                        for k, v in sorted(by_priority.items())},
        "fairness": fairness(run.records, weights=weights),
        "met_slo": met,
        "goodput_arrival_window_rps": met / window if window > 0 else None,
        "rejections_by_reason": dict(reasons),
        "rejections_with_retry_after": sum(";retry_after_s=" in reason for reason in rejections),
        "max_waiting_sampled": max((s.waiting for s in run.samples), default=0),
        "preemptions": run.preemptions,
        "steps": run.steps,
        "makespan_s": run.makespan_s,
        "utilisation": run.busy_s / duration if duration > 0 else None,
        "wall_s": run.wall_s,
        "steps_per_s": run.steps / run.wall_s if run.wall_s > 0 else None,
    }
