"""Decode-protection targets, judged on a replay summary against the stock systems.

For every ``pipeline:`` system in the summary, against the stock systems of the same run
(``fcfs``, ``priority``, ``stock+queue-caps``):

1. ``short_itl_jitter``: short-request ITL p99/p50 at most `RATIO` times ``fcfs``'s;
2. ``high_priority_tpot``: TPOT p99 of the most urgent priority (Gold, -1) at most `RATIO`
   times ``fcfs``'s;
3. ``ttft_kept``: short- and long-prompt TTFT p99 at most `TTFT_SLACK` times those of
   ``pipeline:default`` (the TTFT gains the decode protection must not give back); a system
   without ``pipeline:default`` in the run is compared with the best stock system.

Each entry also carries the best stock value of the metric and the system that has it, so a
verdict can be read against the strongest stock peer, not only ``fcfs``: the stock systems
of the run and, when the run swept ``stock+queue-caps``, every setting of the sweep
(``summary["queue_caps_sweep"]``, named by its setting), since the setting best by goodput
need not be the best at this metric. ``passed_vs_best_stock`` is the stricter reading of
targets 1 and 2: the value at most `RATIO` times the best stock value. A missing metric
fails its target.
"""

from __future__ import annotations

STOCK = ("fcfs", "priority", "stock+queue-caps")
BASELINE = "fcfs"
REFERENCE = "pipeline:default"
RATIO = 0.6
TTFT_SLACK = 1.1


def _get(summary: dict, system: str, *path: str) -> float | None:
    value = summary["systems"].get(system)
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


SWEEP_COLUMNS = {("by_class", "short", "itl_jitter"): "short_itl_jitter",
                 ("by_class", "short", "ttft_p99_s"): "short_ttft_p99_s",
                 ("by_class", "long", "ttft_p99_s"): "long_ttft_p99_s"}
"""Metric path -> its column in a ``queue_caps_sweep`` row (the top priority's TPOT p99 is
``top_priority_tpot_p99_s``)."""


def is_stock(system: str) -> bool:
    """Whether ``system`` is stock vLLM: ``fcfs``, ``priority`` or a queue-caps setting."""
    return system in STOCK or system.startswith("stock+queue-caps:")


def _best_stock(summary: dict, *path: str) -> tuple[str | None, float | None]:
    values = [(s, v) for s in summary["systems"]
              if is_stock(s) and (v := _get(summary, s, *path)) is not None]
    column = ("top_priority_tpot_p99_s" if path[:1] == ("by_priority",) and path[-1:] == (
        "tpot_p99_s",) else SWEEP_COLUMNS.get(tuple(path)))
    for row in (summary.get("queue_caps_sweep") or {}).get("settings", []):
        if column is not None and row.get(column) is not None:
            values.append((row["setting"], row[column]))
    return min(values, key=lambda item: item[1]) if values else (None, None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _entry(target: str, system: str, value: float | None, baseline: float | None,
           best: tuple[str | None, float | None], limit: float) -> dict:
    ratio = _ratio(value, baseline)
    return {"target": target, "system": system, "value": value, "fcfs": baseline,
            "ratio_to_fcfs": ratio, "best_stock_system": best[0], "best_stock": best[1],
            "ratio_to_best_stock": _ratio(value, best[1]), "limit": limit,
            "passed": ratio is not None and ratio <= limit,
            "passed_vs_best_stock": (value is not None and best[1] is not None
                                     and value <= limit * best[1])}


def decode_protection_targets(summary: dict) -> list[dict]:
    """Every target for every ``pipeline:`` system (none without ``fcfs`` or Gold requests)."""
    systems = summary["systems"]
    top = min((int(p) for p in systems.get(BASELINE, {}).get("by_priority", {})), default=None)
    if BASELINE not in systems or top is None:
        return []
    jitter, tpot = ("by_class", "short", "itl_jitter"), ("by_priority", str(top), "tpot_p99_s")
    entries = []
    for system in systems:
        if not system.startswith("pipeline:"):
            continue
        entries.append(_entry("short_itl_jitter", system, _get(summary, system, *jitter),
                              _get(summary, BASELINE, *jitter), _best_stock(summary, *jitter),
                              RATIO))
        entries.append(_entry("high_priority_tpot", system, _get(summary, system, *tpot),
                              _get(summary, BASELINE, *tpot), _best_stock(summary, *tpot),
                              RATIO))
        for length in ("short", "long"):
            path = ("by_class", length, "ttft_p99_s")
            reference = (_get(summary, REFERENCE, *path) if REFERENCE in systems
                         else _best_stock(summary, *path)[1])
            value = _get(summary, system, *path)
            ratio = _ratio(value, reference)
            entries.append({"target": f"ttft_kept_{length}", "system": system, "value": value,
                            "reference": reference,
                            "reference_system": REFERENCE if REFERENCE in systems
                            else _best_stock(summary, *path)[0],
                            "ratio": ratio, "best_stock_system": _best_stock(summary, *path)[0],
                            "best_stock": _best_stock(summary, *path)[1], "limit": TTFT_SLACK,
                            "passed": ratio is not None and ratio <= TTFT_SLACK})
    return entries


def format_targets(entries: list[dict]) -> str:
    """One line per target: verdict, system, value and its comparisons."""
    lines = []
    for e in entries:
        verdict = "met   " if e["passed"] else "MISSED"
        if e["target"].startswith("ttft_kept"):
            detail = (f"{e['value']:.3f} s vs {e['reference_system']} {e['reference']:.3f} s "
                      f"({e['ratio']:.2f}x, limit {e['limit']}x; best stock "
                      f"{e['best_stock_system']} {e['best_stock']:.3f} s)"
                      if e["value"] is not None and e["ratio"] is not None else "-")
        else:
            strict = "met" if e["passed_vs_best_stock"] else "missed"
            detail = (f"{e['value']:.4g} vs fcfs {e['fcfs']:.4g} ({e['ratio_to_fcfs']:.2f}x, "
                      f"limit {e['limit']}x; best stock {e['best_stock_system']} "
                      f"{e['best_stock']:.4g}, {e['ratio_to_best_stock']:.2f}x: {strict} "
                      f"against it)" if e["value"] is not None and e["fcfs"]
                      and e["best_stock"] else "-")
        lines.append(f"{verdict}  {e['system']:<40} {e['target']}: {detail}")
    return "\n".join(lines)
