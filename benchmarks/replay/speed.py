"""``python -m benchmarks.replay.speed``: how fast one system replays a trace, with and
without fast-forward, in one run.

Example (the issue's replay-speed target: the full ``azure-conv`` hour, one system):

    python -m benchmarks.replay.speed --trace azure-conv --system fcfs --out out/speed

Loads the trace once, then replays it through ``--system`` twice, with fast-forward
(`benchmarks.replay.fast_forward`) and step by step, in that order (``--order`` swaps it),
and checks that both runs produced the same records, engine samples and counters. For each
mode it writes wall and CPU seconds (this process, all threads) of the trace load, the
replay and the summary (`benchmarks.replay.metrics.summarize`), and the load average
before and after, to ``OUT/summary.json``, with a bar chart in ``OUT/speed.png``. On a
shared machine the wall time stretches with the load; the CPU time and the ratio of the two
modes measured back to back are the comparable numbers. ``summary.json["target"]`` judges
the issue's goal: the whole fast-forwarded replay (load + replay + summary) in at most
`TARGET_S` seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import attrs

from benchmarks.replay.cli import add_run_arguments, engine_shape
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.records import SystemRun
from benchmarks.replay.workloads import TENANT_WEIGHTS, load_workload

TARGET_S = 120.0
"""Issue 16: one system's full ``azure-conv`` hour in at most two minutes on 2 cores."""
MODES = {"fast_forward": True, "step_by_step": False}


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> dict[str, float]:
    wall, cpu = _clock()
    return {"wall_s": wall - start[0], "cpu_s": cpu - start[1]}


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def same_result(a: SystemRun, b: SystemRun) -> bool:
    """Whether two runs of one system report the same thing (everything but their speed)."""
    def state(run: SystemRun) -> tuple[list[dict], dict]:
        # records compare by identity (`RequestRecord` is mutable), so compare their fields
        records = [attrs.asdict(r) for r in run.records]
        counters = attrs.asdict(run, filter=lambda a, _v: a.name not in (
            "records", "wall_s", "fast_forwarded_steps"))
        return records, counters
    return state(a) == state(b)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-conv", help="built-in name or file path")
    parser.add_argument("--format", default="auto", help="auto, jsonl, azure or mooncake")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--system", default="fcfs",
                        help="one system, as in `python -m benchmarks.replay --systems`")
    parser.add_argument("--order", choices=["fast-first", "step-first"], default="fast-first",
                        help="which mode runs first")
    add_run_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    load_avg_start = _load_average()
    start = _clock()
    trace = load_workload(args.trace, format=args.format,
                          max_requests=args.max_requests).scaled(args.rate_scale)
    load = _since(start)
    cost_model = StepCostModel.preset(args.gpu)
    shape = engine_shape(args)
    modes = list(MODES) if args.order == "fast-first" else list(reversed(MODES))
    results, runs = {}, {}
    for mode in modes:
        before = _load_average()
        start = _clock()
        run = replay(trace, args.system, shape=shape, cost_model=cost_model,
                     fast_forward=MODES[mode])
        replay_time = _since(start)
        start = _clock()
        summarize(run, weights=TENANT_WEIGHTS)
        summary_time = _since(start)
        runs[mode] = run
        results[mode] = {
            "load": load, "replay": replay_time, "summary": summary_time,
            "total_wall_s": load["wall_s"] + replay_time["wall_s"] + summary_time["wall_s"],
            "total_cpu_s": load["cpu_s"] + replay_time["cpu_s"] + summary_time["cpu_s"],
            "steps": run.steps, "fast_forwarded_steps": run.fast_forwarded_steps,
            "load_average_before": before, "load_average_after": _load_average()}
        print(f"{mode:>13}: replay {replay_time['wall_s']:.1f} s wall / "
              f"{replay_time['cpu_s']:.1f} s CPU, {run.fast_forwarded_steps:,} of "
              f"{run.steps:,} steps fast-forwarded; load average {_load_average()}")
    fast, step = results["fast_forward"], results["step_by_step"]
    equal = same_result(runs["fast_forward"], runs["step_by_step"])
    summary = {
        "trace": trace.name, "system": args.system, "requests": len(trace.requests),
        "rate_scale": args.rate_scale, "order": modes, "cpu_count": os.cpu_count(),
        "load_average_start": load_avg_start, "load_average_end": _load_average(),
        "modes": results, "records_equal": equal,
        "speedup_wall": step["replay"]["wall_s"] / fast["replay"]["wall_s"],
        "speedup_cpu": step["replay"]["cpu_s"] / fast["replay"]["cpu_s"],
        "target": {"limit_s": TARGET_S, "total_wall_s": fast["total_wall_s"],
                   "total_cpu_s": fast["total_cpu_s"],
                   "passed_wall": fast["total_wall_s"] <= TARGET_S,
                   "passed_cpu": fast["total_cpu_s"] <= TARGET_S}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(summary, args.out / "speed.png")
    print(f"records equal: {equal}; speed-up {summary['speedup_wall']:.2f}x wall, "
          f"{summary['speedup_cpu']:.2f}x CPU; fast-forwarded total "
          f"{fast['total_wall_s']:.1f} s wall / {fast['total_cpu_s']:.1f} s CPU "
          f"(target {TARGET_S:.0f} s)\nwrote summary.json and speed.png to {args.out}")
    return summary


def plot(summary: dict, path: Path) -> None:
    """Wall and CPU seconds of load + replay + summary, per mode."""
    import matplotlib.pyplot as plt

    modes = list(summary["modes"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.38
    for i, (key, label) in enumerate((("total_wall_s", "wall"), ("total_cpu_s", "CPU"))):
        values = [summary["modes"][m][key] for m in modes]
        ax.bar([j + (i - 0.5) * width for j in range(len(modes))], values, width, label=label)
    ax.axhline(summary["target"]["limit_s"], color="grey", linestyle="--", label="target")
    ax.set_xticks(range(len(modes)), [m.replace("_", " ") for m in modes])
    ax.set_ylabel("seconds (load + replay + summary)")
    ax.set_title(f"{summary['trace']}, {summary['requests']:,} requests, {summary['system']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
