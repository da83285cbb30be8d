"""Plots of replay results (matplotlib; saved to files, so any backend works headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.replay.metrics import request_class
from benchmarks.replay.records import SystemRun


def plot_ttft(runs: Sequence[SystemRun], path: Path) -> None:
    """TTFT CDF per system, one panel per request class, log-scaled time axis."""
    classes = sorted({request_class(r) for run in runs for r in run.records})
    fig, axes = plt.subplots(1, len(classes), figsize=(5 * len(classes), 3.6), squeeze=False)
    for ax, cls in zip(axes[0], classes, strict=True):
        for run in runs:
            ttft = np.sort([r.ttft_s for r in run.records
                            if request_class(r) == cls and r.ttft_s is not None])
            if len(ttft):
                ax.plot(np.maximum(ttft, 1e-3), np.arange(1, len(ttft) + 1) / len(ttft),
                        label=run.system)
        ax.set_xscale("log")
        ax.set_title(f"TTFT CDF: {cls} requests")
        ax.set_xlabel("time to first token (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of requests")
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_engine(runs: Sequence[SystemRun], path: Path) -> None:
    """KV-cache usage and waiting-queue length over virtual time, one line per system."""
    fig, (kv, queue) = plt.subplots(1, 2, figsize=(11, 3.6))
    for run in runs:
        times = [s.time_s for s in run.samples]
        kv.plot(times, [100 * s.kv_usage for s in run.samples], label=run.system)
        queue.plot(times, [s.waiting for s in run.samples], label=run.system)
    kv.set_title("KV-cache usage (%)")
    queue.set_title("waiting requests")
    for ax in (kv, queue):
        ax.set_xlabel("virtual time (s)")
        ax.grid(alpha=0.3)
    queue.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tenant_service(runs: Sequence[SystemRun], path: Path) -> None:
    """Cumulative tokens served per tenant over time (prompt at first token, then outputs)."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False,
                             sharey=True)
    for ax, run in zip(axes[0], runs, strict=True):
        events: dict[str, list[tuple[float, int]]] = {}
        for r in run.records:
            if r.token_times_s:
                series = events.setdefault(r.tenant, [])
                series.append((r.token_times_s[0], r.prompt_tokens))
                series.extend((t, 1) for t in r.token_times_s)
        for tenant in sorted(events):
            series = sorted(events[tenant])
            ax.plot([t for t, _ in series], np.cumsum([n for _, n in series]), label=tenant)
        ax.set_title(f"service by tenant: {run.system}")
        ax.set_xlabel("virtual time (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tokens served")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
