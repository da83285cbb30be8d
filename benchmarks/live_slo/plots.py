"""The benchmark's figures: admitted attainment and goodput against load, one line per system."""

from __future__ import annotations

from pathlib import Path

FIGURES = ("attainment.png", "goodput.png")


def load_series(summary: dict, key: str) -> dict[str, list[tuple[float, float]]]:
    """Per system, ``(load, mean over seeds of key)`` for the Poisson scenarios without
    contention, by load."""
    series: dict[str, list[tuple[float, float]]] = {}
    for name, seeds in summary["runs"].items():
        scenario = summary["config"]["scenarios"][name]
        if scenario["load"] is None or scenario["contention"]:
            continue
        per_system: dict[str, list[float]] = {}
        for systems in seeds.values():
            for system, metrics in systems.items():
                if metrics[key] is not None:
                    per_system.setdefault(system, []).append(metrics[key])
        for system, values in per_system.items():
            series.setdefault(system, []).append((scenario["load"], sum(values) / len(values)))
    return {system: sorted(points) for system, points in series.items()}


def plot_all(summary: dict, out: Path) -> None:
    """Write `FIGURES` to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for filename, key, label in (("attainment.png", "admitted_slo_attainment",
                                  "admitted requests in SLO"),
                                 ("goodput.png", "goodput_rps", "goodput (req/s in SLO)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for system, points in load_series(summary, key).items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linewidth=2.5 if system == "slo" else 1.2, label=system)
        ax.set_xlabel("offered load (x measured capacity)")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        loads = sorted({p[0] for points in load_series(summary, key).values() for p in points})
        ax.set_xticks(loads, [f"{load:g}x" for load in loads])
        ax.set_title(f"live CPU engine, capacity "
                     f"{summary['capacity']['capacity_rps']:.1f} req/s")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / filename, dpi=120)
        plt.close(fig)
