"""The business case's targets, judged on a study summary (issue 7).

Each target compares a candidate system with stock ``fcfs`` from the same run:

1. ``gold_short_ttft``: Gold short-request TTFT p99 within the Gold TTFT SLO in every phase.
2. ``short_ttft_halved``: short-request TTFT p99 at most half of ``fcfs``'s, in every phase.
3. ``jain``: Jain's index at least 0.95 in phases 3 to 5.
4. ``overload_conservation``: in the last phase, admitted + rejected = offered and every
   rejection carries a Retry-After.
5. ``hit_rate_recovery``: the prompt-switching tenant's prefix hit rate in the phase after
   the switch is back to at least 95 % of its baseline-phase rate.

A metric that is missing (e.g. no Gold short request completed) fails its target.
"""

from __future__ import annotations

BASELINE = "fcfs"
CANDIDATES = ("pipeline", "pipeline+fixes", "pipeline+fixes+guard")
SHORT_RATIO = 0.5
JAIN_MIN = 0.95
JAIN_PHASES = (2, 3, 4)
RECOVERY_SHARE = 0.95


def _values(summary: dict, system: str, key: str) -> list:
    return [phase["systems"][system][key] for phase in summary["phases"]]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _judge(system: str, summary: dict) -> list[dict]:
    gold_slo = summary["config"]["slos"]["gold"]["ttft_s"]
    gold = _values(summary, system, "gold_short_ttft_p99_s")
    ratios = [_ratio(a, b) for a, b in zip(_values(summary, system, "short_ttft_p99_s"),
                                           _values(summary, BASELINE, "short_ttft_p99_s"),
                                           strict=True)]
    jain = [_values(summary, system, "jain_index")[i] for i in JAIN_PHASES
            if i < len(summary["phases"])]
    last = summary["phases"][-1]["systems"][system]
    hits = _values(summary, system, "switch_tenant_hit_rate")
    recovery = _ratio(hits[2], hits[0]) if len(hits) > 2 else None
    return [
        {"target": "gold_short_ttft", "system": system, "values": gold,
         "passed": all(v is not None and v <= gold_slo for v in gold)},
        {"target": "short_ttft_halved", "system": system, "values": ratios,
         "passed": all(v is not None and v <= SHORT_RATIO for v in ratios)},
        {"target": "jain", "system": system, "values": jain,
         "passed": all(v is not None and v >= JAIN_MIN for v in jain)},
        {"target": "overload_conservation", "system": system,
         "values": [last["offered"], last["admitted"], last["rejected"],
                    last["rejections_with_retry_after"]],
         "passed": last["conserved"] and last["all_rejections_have_retry_after"]},
        {"target": "hit_rate_recovery", "system": system, "values": [recovery],
         "passed": recovery is not None and recovery >= RECOVERY_SHARE},
    ]


def evaluate(summary: dict) -> list[dict]:
    """Every target for each candidate system in the summary (none without ``fcfs``).

    Each entry: ``target``, ``system``, ``values`` (per phase where the target is
    per phase; for ``overload_conservation`` offered, admitted, rejected and
    rejections with Retry-After) and ``passed``.
    """
    systems = summary["phases"][0]["systems"] if summary["phases"] else {}
    if BASELINE not in systems:
        return []
    return [entry for system in CANDIDATES if system in systems
            for entry in _judge(system, summary)]
