"""Plots of replay results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.replay.metrics import request_class  # noqa: E402
from benchmarks.replay.records import SystemRun  # noqa: E402


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
