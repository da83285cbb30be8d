"""Markdown and console tables generated from a study summary (`study.run_study`).

Everything here reads the summary only, so the report can be regenerated from
``summary.json`` without replaying anything.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.e2e_business_cases.targets import (
    JAIN_MIN,
    RECOVERY_SHARE,
    SHORT_RATIO,
)

Cell = Callable[[dict], str]


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.0f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _admission(m: dict) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in m["rejections_by_reason"].items())
    retry = "all with Retry-After" if m["all_rejections_have_retry_after"] else (
        f"{m['rejections_with_retry_after']} with Retry-After")
    text = f"{m['offered']} = {m['admitted']} + {m['rejected']}"
    return text + (f" ({reasons}; {retry})" if m["rejected"] else "")


METRICS: tuple[tuple[str, Cell], ...] = (
    ("Gold short-request TTFT p99 (ms)", lambda m: _ms(m["gold_short_ttft_p99_s"])),
    ("Short-request TTFT p99 (ms)", lambda m: _ms(m["short_ttft_p99_s"])),
    ("TTFT p99 (ms), Gold / Silver / Bronze",
     lambda m: " / ".join(_ms(v) for v in m["ttft_p99_s_by_tier"].values())),
    ("SLO attainment, Gold / Silver / Bronze",
     lambda m: " / ".join(_pct(v) for v in m["slo_attainment_by_tier"].values())),
    ("Goodput (SLO-meeting req/s)", lambda m: _num(m["goodput_rps"])),
    ("Jain's index (tier-weighted, backlogged tenants)", lambda m: _num(m["jain_index"], 3)),
    ("Jain's index (served tokens / weighted fair share)",
     lambda m: _num(m["fair_share_jain"], 3)),
    ("Prefix-cache hit rate", lambda m: _pct(m["prefix_hit_rate"])),
    ("Offered = admitted + rejected", _admission),
    ("Waiting queue, max", lambda m: "–" if m["queue_len_max"] is None
     else str(m["queue_len_max"])),
)
"""Row title and cell formatter of each per-phase table."""


def _systems(summary: dict) -> list[str]:
    return list(summary["phases"][0]["systems"]) if summary["phases"] else []


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _phase_title(index: int, phase: dict) -> str:
    return f"{index + 1}. {phase['name']} ({phase['start_s']:.0f}–{phase['end_s']:.0f} s)"


def phase_tables(summary: dict) -> list[str]:
    """One markdown table per phase: a row per metric of `METRICS`, a column per system."""
    systems = _systems(summary)
    lines: list[str] = []
    for index, phase in enumerate(summary["phases"]):
        lines += [f"#### {_phase_title(index, phase)}", ""]
        lines += _table(["metric", *systems],
                        [[title, *(cell(phase["systems"][s]) for s in systems)]
                         for title, cell in METRICS])
        lines.append("")
    return lines


def headline_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the headline: Gold short TTFT p99 (ms) per phase and system."""
    systems = _systems(summary)
    rows = [[_phase_title(i, phase),
             *(_ms(phase["systems"][s]["gold_short_ttft_p99_s"]) for s in systems)]
            for i, phase in enumerate(summary["phases"])]
    return ["phase", *systems], rows


TARGET_TITLES = {
    "gold_short_ttft": "Gold short TTFT p99 within the Gold SLO, every phase",
    "short_ttft_halved": f"short TTFT p99 ≤ {SHORT_RATIO}× fcfs, every phase",
    "jain": f"Jain ≥ {JAIN_MIN} in phases 3–5",
    "overload_conservation": "phase 5: offered = admitted + rejected, all with Retry-After",
    "hit_rate_recovery": f"switched tenant's hit rate in phase 3 ≥ {RECOVERY_SHARE:.0%} "
                         "of phase 1",
}


def _target_values(entry: dict) -> str:
    if entry["target"] == "overload_conservation":
        offered, admitted, rejected, retry = entry["values"]
        return f"{offered} = {admitted} + {rejected}; {retry} with Retry-After"
    if entry["target"] == "gold_short_ttft":
        return ", ".join(_ms(v) for v in entry["values"]) + " ms"
    return ", ".join(_num(v) for v in entry["values"])


def target_rows(summary: dict) -> list[list[str]]:
    """``[target, system, measured, verdict]`` per evaluated target."""
    return [[TARGET_TITLES[e["target"]], e["system"], _target_values(e),
             "met" if e["passed"] else "**missed**"] for e in summary["targets"]]


def markdown_report(summary: dict) -> str:
    """The whole report: the headline, the targets and the per-phase tables."""
    gold_slo = summary["config"]["slos"]["gold"]["ttft_s"]
    header, rows = headline_rows(summary)
    lines = [f"Workload: {summary['config']['requests']} requests, five phases of "
             f"{summary['config']['phase_s']:.0f} s. Gold TTFT SLO: {_ms(gold_slo)} ms.", "",
             "#### Gold short-request TTFT p99 (ms)", ""]
    lines += _table(header, rows) + ["", "#### Targets (each candidate vs stock fcfs)", ""]
    lines += _table(["target", "system", "measured", "verdict"], target_rows(summary)) + [""]
    return "\n".join(lines + phase_tables(summary))


def console_table(summary: dict) -> str:
    """The headline and the target verdicts as fixed-width text for the terminal."""
    header, rows = headline_rows(summary)
    widths = [max(len(r[i]) for r in [header, *rows]) + 2 for i in range(len(header))]
    lines = ["Gold short-request TTFT p99 (ms)"]
    lines += ["".join(cell.rjust(w) if i else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
              for row in [header, *rows]]
    lines.append("")
    lines += [f"{'met   ' if e['passed'] else 'MISSED'}  {e['system']:<15} "
              f"{TARGET_TITLES[e['target']]}: {_target_values(e)}" for e in summary["targets"]]
    return "\n".join(lines)
