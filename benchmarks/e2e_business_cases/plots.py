"""Figures of a study summary (matplotlib, saved to files; any backend works headless).

Every plot reads the summary only (`study.run_study`), never the replay records.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

FIGURES = ("gold_ttft.png", "jain.png", "hit_rate.png", "goodput.png")
"""The files `plot_all` writes."""


def _phase_bars(summary: dict, key: str, ax: plt.Axes, scale: float = 1.0) -> None:
    """Grouped bars: one group per phase, one bar per system; a missing value draws none."""
    phases = summary["phases"]
    systems = list(phases[0]["systems"])
    width = 0.8 / len(systems)
    x = np.arange(len(phases))
    for i, system in enumerate(systems):
        values = [p["systems"][system][key] for p in phases]
        ax.bar(x + (i - (len(systems) - 1) / 2) * width,
               [np.nan if v is None else v * scale for v in values], width, label=system)
    ax.set_xticks(x, [f"{i + 1}. {p['name']}" for i, p in enumerate(phases)])
    ax.grid(axis="y", alpha=0.3)


def plot_gold_ttft(summary: dict, path: Path) -> None:
    """Gold short-request TTFT p99 per phase and system (log scale) against the Gold SLO."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    _phase_bars(summary, "gold_short_ttft_p99_s", ax, scale=1000.0)
    ax.axhline(summary["config"]["slos"]["gold-chat"]["ttft_s"] * 1000, color="k", ls="--",
               label="Gold TTFT SLO")
    ax.set_yscale("log")
    ax.set_ylabel("Gold short TTFT p99 (ms)")
    ax.legend(fontsize=8, ncol=5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_jain(summary: dict, path: Path) -> None:
    """Jain's index per phase and system (no bar where no two tenants were backlogged)."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    _phase_bars(summary, "jain_index", ax)
    ax.axhline(0.95, color="k", ls="--", label="target 0.95")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Jain's index")
    ax.legend(fontsize=8, ncol=5, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_hit_rate(summary: dict, path: Path) -> None:
    """Prefix-cache hit rate over arrival time: all tenants, and the prompt-switching tenant."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    titles = ("all tenants", f"{summary['config']['switch_tenant']} (prompt switch)")
    for ax, key, title in zip(axes, ("hit_rate", "switch_tenant_hit_rate"), titles,
                              strict=True):
        for system, points in summary["series"][key].items():
            if points:
                t, rate = zip(*points, strict=True)
                ax.plot(t, np.asarray(rate) * 100, marker=".", label=system)
        for phase in summary["phases"][1:]:
            ax.axvline(phase["start_s"], color="grey", lw=0.8)
        ax.axvline(summary["config"]["switch_s"], color="r", ls="--", lw=1)
        ax.set_title(f"prefix-cache hit rate: {title}")
        ax.set_xlabel("arrival time (s); grey: phase starts, red: prompt switch")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit rate (% of prompt tokens)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_goodput(summary: dict, path: Path) -> None:
    """Goodput and the share of admitted requests meeting their SLO, per phase and system."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.2), sharex=True)
    _phase_bars(summary, "goodput_rps", axes[0])
    axes[0].axhline(9.0, color="k", ls="--", label="overload target 9 req/s")
    axes[0].set_ylabel("goodput (SLO-meeting req/s)")
    axes[0].legend(fontsize=8, ncol=4, loc="upper left")
    _phase_bars(summary, "admitted_slo_attainment", axes[1], scale=100.0)
    axes[1].axhline(95, color="k", ls="--", label="overload target 95 %")
    axes[1].set_ylim(0, 105)
    axes[1].set_ylabel("admitted requests\nmeeting their SLO (%)")
    axes[1].legend(fontsize=8, ncol=4, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(summary: dict, out: Path) -> None:
    """Write every figure of `FIGURES` into ``out``."""
    plot_gold_ttft(summary, out / FIGURES[0])
    plot_jain(summary, out / FIGURES[1])
    plot_hit_rate(summary, out / FIGURES[2])
    plot_goodput(summary, out / FIGURES[3])
