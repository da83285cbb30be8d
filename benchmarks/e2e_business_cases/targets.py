"""The business case's targets, judged on a study summary (issues 7 and 16).

Each target compares a candidate system with the best stock system of the same run (``fcfs``,
``priority``, the ``stock+queue-caps`` sweep or a named ``stock+queue-caps:...`` setting:
whichever has the best value of the metric, phase by phase), and every entry carries that best stock value beside the candidate's:

1. ``gold_short_ttft``: Gold short-request TTFT p99 within the Gold TTFT SLO in every phase.
2. ``short_ttft_halved``: short-request TTFT p99 at most half the best stock system's, in
   every phase.
3. ``jain``: Jain's index at least 0.95 in phases 3 to 5.
4. ``overload_conservation``: in the last phase, admitted + rejected = offered and every
   rejection carries a Retry-After.
5. ``hit_rate_recovery``: the prompt-switching tenant's prefix hit rate in the phase after
   the switch is back to at least 95 % of its baseline-phase rate.
6. ``overload_admitted_slo``: in the last phase, at least 95 % of the admitted requests meet
   their SLO (``admitted_slo_attainment``, a cancelled request counting as a miss).
7. ``overload_goodput``: in the last phase, goodput at least 9.0 requests/s and at least the
   best stock system's.

A metric that is missing (e.g. no Gold short request completed) fails its target.
"""

from __future__ import annotations

from benchmarks.replay.targets import is_stock

CANDIDATES = ("pipeline", "pipeline+fixes", "pipeline+slo", "pipeline+fixes+guard")
SHORT_RATIO = 0.5
JAIN_MIN = 0.95
JAIN_PHASES = (2, 3, 4)
RECOVERY_SHARE = 0.95
ADMITTED_SLO_MIN = 0.95
GOODPUT_MIN_RPS = 9.0


def _values(summary: dict, system: str, key: str) -> list:
    return [phase["systems"][system][key] for phase in summary["phases"]]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _stock(summary: dict) -> list[str]:
    systems = summary["phases"][0]["systems"] if summary["phases"] else {}
    return [s for s in systems if is_stock(s)]


def _best(summary: dict, key: str, *, higher: bool, phase: int) -> tuple[str | None, object]:
    """The stock system with the best ``key`` in phase ``phase``, and that value."""
    values = [(s, v) for s in _stock(summary)
              if (v := summary["phases"][phase]["systems"][s][key]) is not None]
    if not values:
        return None, None
    pick = max if higher else min
    return pick(values, key=lambda item: item[1])


def _best_per_phase(summary: dict, key: str, *, higher: bool) -> tuple[list, list]:
    best = [_best(summary, key, higher=higher, phase=i) for i in range(len(summary["phases"]))]
    return [b[1] for b in best], [b[0] for b in best]


def _judge(system: str, summary: dict) -> list[dict]:
    gold_slo = summary["config"]["slos"]["gold-chat"]["ttft_s"]
    gold = _values(summary, system, "gold_short_ttft_p99_s")
    best_gold, gold_by = _best_per_phase(summary, "gold_short_ttft_p99_s", higher=False)
    best_short, short_by = _best_per_phase(summary, "short_ttft_p99_s", higher=False)
    ratios = [_ratio(a, b) for a, b in zip(_values(summary, system, "short_ttft_p99_s"),
                                           best_short, strict=True)]
    jain = [_values(summary, system, "jain_index")[i] for i in JAIN_PHASES
            if i < len(summary["phases"])]
    best_jain = [_best(summary, "jain_index", higher=True, phase=i)[1] for i in JAIN_PHASES
                 if i < len(summary["phases"])]
    last_index = len(summary["phases"]) - 1
    last = summary["phases"][-1]["systems"][system]
    hits = _values(summary, system, "switch_tenant_hit_rate")
    recovery = _ratio(hits[2], hits[0]) if len(hits) > 2 else None
    admitted = last["admitted_slo_attainment"]
    best_admitted = _best(summary, "admitted_slo_attainment", higher=True, phase=last_index)
    goodput = last["goodput_rps"]
    best_goodput = _best(summary, "goodput_rps", higher=True, phase=last_index)
    return [
        {"target": "gold_short_ttft", "system": system, "values": gold,
         "best_stock": best_gold, "best_stock_systems": gold_by,
         "passed": all(v is not None and v <= gold_slo for v in gold)},
        {"target": "short_ttft_halved", "system": system, "values": ratios,
         "best_stock": best_short, "best_stock_systems": short_by,
         "passed": all(v is not None and v <= SHORT_RATIO for v in ratios)},
        {"target": "jain", "system": system, "values": jain, "best_stock": best_jain,
         "passed": all(v is not None and v >= JAIN_MIN for v in jain)},
        {"target": "overload_conservation", "system": system,
         "values": [last["offered"], last["admitted"], last["rejected"],
                    last["rejections_with_retry_after"]],
         "passed": last["conserved"] and last["all_rejections_have_retry_after"]},
        {"target": "hit_rate_recovery", "system": system, "values": [recovery],
         "passed": recovery is not None and recovery >= RECOVERY_SHARE},
        {"target": "overload_admitted_slo", "system": system, "values": [admitted],
         "best_stock": best_admitted[1], "best_stock_systems": best_admitted[0],
         "uncancelled": last["admitted_slo_attainment_uncancelled"],
         "cancelled_on_time": last.get("cancelled_on_time"),
         "passed": admitted is not None and admitted >= ADMITTED_SLO_MIN},
        {"target": "overload_goodput", "system": system, "values": [goodput],
         "best_stock": best_goodput[1], "best_stock_systems": best_goodput[0],
         "passed": goodput is not None and goodput >= GOODPUT_MIN_RPS
         and (best_goodput[1] is None or goodput >= best_goodput[1])},
    ]


def evaluate(summary: dict) -> list[dict]:
    """Every target for each candidate system in the summary (none without a stock system).

    Each entry: ``target``, ``system``, ``values`` (per phase where the target is per phase;
    for ``overload_conservation`` offered, admitted, rejected and rejections with
    Retry-After), ``best_stock`` (the best stock value, per phase where per phase) with
    ``best_stock_systems``, and ``passed``.
    """
    systems = summary["phases"][0]["systems"] if summary["phases"] else {}
    if not _stock(summary):
        return []
    return [entry for system in CANDIDATES if system in systems
            for entry in _judge(system, summary)]
