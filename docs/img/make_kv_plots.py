"""Draw the KV-cache results plots from the block-level replays' summaries.

    python docs/img/make_kv_plots.py

Reads ``docs/results/eviction/**/summary.json`` (written by ``benchmarks.cache_replay``)
and writes three PNGs next to this file.
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
EVICTION = HERE.parent / "results" / "eviction"
LABELS = {"lru": "LRU (vLLM)", "slru": "SegmentedLRU", "shipped": "shipped (cache preset)",
          "dueling": "DuelingSLRU, pins off", "dueling-pins": "DuelingSLRU, pins on",
          "opt": "OPT (offline optimum)"}


def hit_rates(summary: Path) -> dict[str, dict[int, float]]:
    """policy -> cache blocks -> hit rate, from one ``summary.json``."""
    rates: dict[str, dict[int, float]] = {}
    for row in json.loads(summary.read_text())["results"]:
        rates.setdefault(row["policy"], {})[row["cache_blocks"]] = row["hit_rate"]
    return rates


def plot_curves(curves: dict[str, dict[int, float]], title: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for label, points in curves.items():
        sizes = sorted(points)
        ax.plot(sizes, [100 * points[s] for s in sizes], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted({size for points in curves.values() for size in points})
    ax.set_xticks(ticks, [f"{size:,}" for size in ticks])
    ax.minorticks_off()
    ax.set_xlabel("cache size (blocks)")
    ax.set_ylabel("prompt blocks hit (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    conv = hit_rates(EVICTION / "conv" / "summary.json")
    plot_curves({LABELS[p]: conv[p] for p in ("lru", "shipped", "opt")},
                "mooncake-conv: hit rate by cache size", HERE / "kv_hit_rate_conv.png")

    agent = hit_rates(EVICTION / "issue20" / "agent-swe" / "summary.json")
    queued = hit_rates(EVICTION / "issue20" / "agent-swe-waiting8" / "summary.json")
    curves = {LABELS[p]: agent[p] for p in ("lru", "slru", "dueling-pins", "opt")}
    curves["pins on, waiting queue of 8"] = queued["shipped"]
    plot_curves(curves, "agent-swe (seed 0): hit rate by cache size",
                HERE / "kv_hit_rate_agent_swe.png")

    traces = {"conv": "mooncake-conv", "conv-first": "conv, first half",
              "conv-second": "conv, second half", "synthetic": "mooncake-synthetic",
              "azure-conv": "azure-conv", "azure-code": "azure-code"}
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.27
    for i, size in enumerate(("2000", "4000", "8000")):
        gaps = [100 * json.loads((EVICTION / t / "summary.json").read_text())
                ["gap_closed"]["shipped"][size] for t in traces]
        ax.bar([x + (i - 1) * width for x in range(len(traces))], gaps, width,
               label=f"{int(size):,} blocks")
    ax.axhline(30, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(traces)), list(traces.values()), rotation=20, fontsize=8)
    ax.set_ylabel("LRU→OPT gap closed (%)")
    ax.set_title("SegmentedLRU: share of the LRU→OPT gap closed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "kv_gap_closed.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
