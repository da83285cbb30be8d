"""Markdown and console tables generated from a study summary (`study.run_study`).

Everything here reads the summary only, so the report can be regenerated from
``summary.json`` without replaying anything.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.e2e_business_cases.targets import (
    ADMITTED_SLO_MIN,
    GOODPUT_MIN_RPS,
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


def _definition(m: dict, name: str) -> str:
    figures = m.get("by_definition", {}).get(name)
    if figures is None:
        return "–"
    return f"{_num(figures['goodput_rps'])}, {_pct(figures['admitted_slo_attainment'])}"


METRICS: tuple[tuple[str, Cell], ...] = (
    ("Gold short-request TTFT p99 (ms)", lambda m: _ms(m["gold_short_ttft_p99_s"])),
    ("Short-request TTFT p99 (ms)", lambda m: _ms(m["short_ttft_p99_s"])),
    ("TTFT p99 (ms), Gold / Silver / Bronze",
     lambda m: " / ".join(_ms(v) for v in m["ttft_p99_s_by_tier"].values())),
    ("SLO attainment, Gold / Silver / Bronze",
     lambda m: " / ".join(_pct(v) for v in m["slo_attainment_by_tier"].values())),
    ("Goodput (SLO-meeting req/s)", lambda m: _num(m["goodput_rps"])),
    ("Admitted requests meeting their SLO (without on-time client cancels)",
     lambda m: f"{_pct(m['admitted_slo_attainment'])} "
               f"({_pct(m['admitted_slo_attainment_uncancelled'])})"),
    ("Admitted meeting their SLO, Gold / Silver / Bronze",
     lambda m: " / ".join(_pct(v) for v in m["admitted_slo_attainment_by_tier"].values())),
    ("Original tier SLOs: goodput, admitted meeting SLO",
     lambda m: _definition(m, "tier")),
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


def overload_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the overload table: the last phase's goodput and admission per
    system, under the primary SLO definition and the original tier one."""
    last = summary["phases"][-1]["systems"]
    header = ["system", "offered = admitted + rejected", "goodput (req/s)",
              "admitted meeting SLO", "(without on-time cancels)", "tier SLOs: goodput, admitted",
              "Gold short TTFT p99 (ms)"]
    rows = [[s, f"{m['offered']} = {m['admitted']} + {m['rejected']}", _num(m["goodput_rps"]),
             _pct(m["admitted_slo_attainment"]), _pct(m["admitted_slo_attainment_uncancelled"]),
             _definition(m, "tier"), _ms(m["gold_short_ttft_p99_s"])]
            for s, m in last.items()]
    return header, rows


def sweep_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the ``stock+queue-caps`` sweep (empty without one)."""
    sweep = summary.get("queue_caps_sweep")
    if not sweep:
        return [], []
    header = ["setting", "goodput, whole run (req/s)", "admitted meeting SLO", "rejected",
              "overload goodput", "overload admitted meeting SLO",
              "Gold short TTFT p99, worst phase (ms)"]
    rows = [[("**" + r["setting"] + "** (best)") if r["setting"] == sweep["best"]
             else r["setting"], _num(r["goodput_rps"]), _pct(r["admitted_slo_attainment"]),
             str(r["rejected"]), _num(r["overload_goodput_rps"]),
             _pct(r["overload_admitted_slo_attainment"]),
             _ms(r["gold_short_ttft_p99_s_worst_phase"])] for r in sweep["settings"]]
    return header, rows


def definition_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the SLO definitions, class by class (TTFT s / TPOT ms)."""
    definitions = summary.get("slo_definitions", {})
    names = list(definitions)
    classes = list(next(iter(definitions.values()), {}))
    rows = [[cls, *(f"{definitions[n][cls]['ttft_s']:g} s / "
                    f"{definitions[n][cls]['tpot_s'] * 1000:g} ms" for n in names)]
            for cls in classes]
    return ["SLO class", *(f"`{n}` TTFT / TPOT" for n in names)], rows


TARGET_TITLES = {
    "gold_short_ttft": "Gold short TTFT p99 within the Gold SLO, every phase",
    "short_ttft_halved": f"short TTFT p99 ≤ {SHORT_RATIO}× the best stock system's, every phase",
    "overload_admitted_slo": f"phase 5: ≥ {ADMITTED_SLO_MIN:.0%} of admitted requests meet "
                             "their SLO",
    "overload_goodput": f"phase 5: goodput ≥ {GOODPUT_MIN_RPS} req/s and ≥ the best stock "
                        "system's",
    "jain": f"Jain ≥ {JAIN_MIN} in phases 3–5",
    "overload_conservation": "phase 5: offered = admitted + rejected, all with Retry-After",
    "hit_rate_recovery": f"switched tenant's hit rate in phase 3 ≥ {RECOVERY_SHARE:.0%} "
                         "of phase 1",
}


def _target_values(entry: dict) -> str:
    target = entry["target"]
    if target == "overload_conservation":
        offered, admitted, rejected, retry = entry["values"]
        return f"{offered} = {admitted} + {rejected}; {retry} with Retry-After"
    if target == "gold_short_ttft":
        return (", ".join(_ms(v) for v in entry["values"]) + " ms (best stock: "
                + ", ".join(_ms(v) for v in entry["best_stock"]) + ")")
    if target == "overload_admitted_slo":
        cancels = entry.get("cancelled_on_time")
        counted = "" if cancels is None else f"{cancels} "
        return (f"{_pct(entry['values'][0])} ({_pct(entry['uncancelled'])} without the "
                f"{counted}on-time client cancels; best stock {entry['best_stock_systems']} "
                f"{_pct(entry['best_stock'])})")
    if target == "overload_goodput":
        return (f"{_num(entry['values'][0])} req/s (best stock {entry['best_stock_systems']} "
                f"{_num(entry['best_stock'])})")
    if target == "jain":
        return (", ".join(_num(v) for v in entry["values"]) + " (best stock: "
                + ", ".join(_num(v) for v in entry["best_stock"]) + ")")
    return ", ".join(_num(v) for v in entry["values"])


def target_rows(summary: dict) -> list[list[str]]:
    """``[target, system, measured, verdict]`` per evaluated target."""
    return [[TARGET_TITLES[e["target"]], e["system"], _target_values(e),
             "met" if e["passed"] else "**missed**"] for e in summary["targets"]]


def markdown_report(summary: dict) -> str:
    """The whole report: the headlines, the targets, the sweep, the SLOs and the phases."""
    config = summary["config"]
    gold_slo = config["slos"]["gold-chat"]["ttft_s"]
    header, rows = headline_rows(summary)
    lines = [f"Workload: {config['requests']} requests, five phases of "
             f"{config['phase_s']:.0f} s. Gold short-request TTFT SLO: {_ms(gold_slo)} ms. "
             f"SLOs: the `{config.get('slo_definition', '')}` definition (below); headline "
             f"system: `{summary.get('headline', '')}`.", "",
             "#### Gold short-request TTFT p99 (ms)", ""]
    lines += _table(header, rows)
    lines += ["", "#### Phase 5 (overload): goodput and admission", ""]
    lines += _table(*overload_rows(summary))
    lines += ["", "#### Targets (each candidate vs the best stock system of the run)", ""]
    lines += _table(["target", "system", "measured", "verdict"], target_rows(summary)) + [""]
    sweep_header, sweep = sweep_rows(summary)
    if sweep:
        caps = summary["queue_caps_sweep"]
        lines += ["#### `stock+queue-caps` sweep (vLLM's `max_num_queued_reqs` / "
                  "`max_num_queued_tokens`)", "",
                  f"Best by {caps['criterion']}: `{caps['best']}`.", ""]
        lines += _table(sweep_header, sweep) + [""]
    definitions = definition_rows(summary)
    if definitions[1]:
        lines += ["#### SLO definitions", ""] + _table(*definitions) + [""]
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
    header, rows = overload_rows(summary)
    lines.append("Phase 5 (overload): " + ", ".join(header[1:]))
    lines += [f"  {r[0]:<18} " + " | ".join(r[1:]) for r in rows]
    if summary.get("queue_caps_sweep"):
        lines.append(f"stock+queue-caps = {summary['queue_caps_sweep']['best']} "
                     f"(best of {len(summary['queue_caps_sweep']['settings'])} settings)")
    lines.append("")
    lines += [f"{'met   ' if e['passed'] else 'MISSED'}  {e['system']:<15} "
              f"{TARGET_TITLES[e['target']]}: {_target_values(e)}" for e in summary["targets"]]
    return "\n".join(lines)
