"""``python -m benchmarks.live_slo``: the ``slo`` preset against stock vLLM, live, overloaded.

Example:

    python -m benchmarks.live_slo --quick --out out/live_slo

Measures the engine's capacity on a stock server, then streams open-loop Poisson arrivals at
1x, 2x and 4x capacity, two bursts, a 2x run beside a busy CPU and a 2x run where one team sends
three times the other's requests, through each system's own
OpenAI server (`run`), judging every request on the client (`summary`). Writes
``OUT/summary.json`` (per scenario, seed and system; the goals), ``OUT/runs/.../requests.jsonl``
(every request), ``OUT/attainment.png`` and ``OUT/goodput.png``.

``--quick`` (18 minutes on a busy 2-core machine, mostly five server starts): one seed, 10 s windows, a 500-request burst
instead of 2,000, one queue-caps setting, one server per system reused across scenarios.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

import attrs
from tqdm import tqdm

from benchmarks.live_slo.plots import FIGURES, plot_all
from benchmarks.live_slo.run import QUEUE_WAIT_S, STOCK, Settings, run_benchmark
from benchmarks.live_slo.summary import NOISY_TEAM_SHARES, SLO_SYSTEM, STALL_LIMIT_S
from benchmarks.live_slo.workload import Scenario


def scenarios(*, duration_s: float, big_burst: int) -> tuple[Scenario, ...]:
    """1x, 2x and 4x capacity; 10 s of capacity at once; ``big_burst`` at once; 2x beside a
    busy CPU; 2x with one team sending three times the other's requests."""
    return (Scenario(name="1x", load=1.0, duration_s=duration_s),
            Scenario(name="2x", load=2.0, duration_s=duration_s),
            Scenario(name="4x", load=4.0, duration_s=duration_s),
            Scenario(name="burst-10s", burst_s=10.0),
            Scenario(name=f"burst-{big_burst}", burst=big_burst),
            Scenario(name="2x-contention", load=2.0, duration_s=duration_s, contention=True),
            Scenario(name="2x-noisy-team", load=2.0, duration_s=duration_s,
                     tenant_shares=NOISY_TEAM_SHARES))


FULL = Settings(scenarios=scenarios(duration_s=30.0, big_burst=2000))
QUICK = Settings(seeds=(0,), scenarios=scenarios(duration_s=10.0, big_burst=500),
                 queue_waits_s=(1.0,), capacity_step_s=8.0, drain_s=20.0,
                 server_per_run=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--quick", action="store_true", help="the ~10 minute version")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; "
                        "--quick: 0)")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated systems besides the queue-caps sweep "
                             f"(default {SLO_SYSTEM},{','.join(STOCK)})")
    parser.add_argument("--queue-waits", default=None,
                        help="queue caps swept: capacity x these seconds, comma-separated "
                             f"(default {','.join(map(str, QUEUE_WAIT_S))}; --quick: 1.0; "
                             "empty: none)")
    parser.add_argument("--scenarios", default=None,
                        help="comma-separated scenarios to run (default all: "
                             f"{','.join(s.name for s in QUICK.scenarios)}; the burst of "
                             "2,000 is burst-2000 without --quick)")
    parser.add_argument("--capacity-rps", type=float, default=None,
                        help="skip the capacity measurement and use this rate")
    parser.add_argument("--stall-retries", type=int, default=0,
                        help="play a run again, up to this many times, while the client "
                             "stood still over 1 s in it (a virtual machine paused by its "
                             "host; the stalls of every play are recorded)")
    parser.add_argument("--fresh-connections", action="store_true",
                        help="send each request on a connection of its own (default: "
                             "connections kept alive and reused, as an SDK's pool does)")
    parser.add_argument("--server-per-system", action="store_true",
                        help="one server per seed and system, reused across scenarios "
                             "(--quick does this; the full run starts one per run)")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    """The `Settings` the command line asks for."""
    settings = QUICK if args.quick else FULL
    changes: dict = {}
    if args.seeds:
        changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
    if args.systems:
        changes["base_systems"] = tuple(args.systems.split(","))
    if args.queue_waits is not None:
        changes["queue_waits_s"] = tuple(float(w) for w in args.queue_waits.split(",") if w)
    if args.scenarios:
        by_name = {scenario.name: scenario for scenario in settings.scenarios}
        names = args.scenarios.split(",")
        unknown = sorted(set(names) - set(by_name))
        if unknown:
            raise SystemExit(f"--scenarios: unknown {', '.join(unknown)} (known: "
                             f"{', '.join(by_name)})")
        changes["scenarios"] = tuple(by_name[name] for name in names)
    if args.capacity_rps:
        changes["capacity_rps"] = args.capacity_rps
    if args.server_per_system:
        changes["server_per_run"] = False
    if args.stall_retries < 0:
        raise SystemExit(f"--stall-retries must be >= 0, got {args.stall_retries}")
    changes["stall_retries"] = args.stall_retries
    changes["fresh_connections"] = args.fresh_connections
    return attrs.evolve(settings, **changes)


def stalled(goal: dict) -> str:
    """`` (the client stood still N s)`` where a goal's runs stood still over
    `STALL_LIMIT_S`, else nothing."""
    stall_s = goal.get("stall_s", 0.0)
    return f" (the client stood still {stall_s:.1f} s)" if stall_s > STALL_LIMIT_S else ""


def console_table(summary: dict) -> str:
    """Per scenario and system: admitted/offered, attainment and goodput (mean over seeds)."""
    lines = [f"capacity {summary['capacity']['capacity_rps']:.2f} req/s",
             f"{'scenario':<16}{'system':<40}{'admitted/offered':>17}{'attain':>8}"
             f"{'goodput':>9}{'ttft p99':>9}"]
    for name, seeds in summary["runs"].items():
        systems: dict[str, list[dict]] = {}
        for per_seed in seeds.values():
            for system, metrics in per_seed.items():
                systems.setdefault(system, []).append(metrics)
        for system, rows in systems.items():
            attained = [r["admitted_slo_attainment"] for r in rows
                        if r["admitted_slo_attainment"] is not None]
            p99 = [r["ttft_p99_s"] for r in rows if r["ttft_p99_s"] is not None]
            lines.append(
                f"{name:<16}{system:<40}"
                f"{sum(r['admitted'] for r in rows):>8}/{sum(r['offered'] for r in rows):<8}"
                f"{(f'{100 * sum(attained) / len(attained):.1f}%' if attained else '-'):>8}"
                f"{sum(r['goodput_rps'] for r in rows) / len(rows):>9.2f}"
                f"{(f'{max(p99):.2f}' if p99 else '-'):>9}")
    lines.append("")
    for goal in summary["goals"]:
        value = "-" if goal["value"] is None else f"{goal['value']:.3f}"
        bound = "-" if goal["bound"] is None else f"{goal['bound']:.3f}"
        lines.append(f"{'met   ' if goal['met'] else 'MISSED'} {goal['scenario']:<15} seed "
                     f"{goal['seed']}: {goal['goal']}: {value} (bound {bound}"
                     f"{', best stock ' + goal['best_stock'] if goal['best_stock'] else ''})"
                     f"{stalled(goal)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    # a terminated benchmark still stops its server and busy-loop child (``finally`` blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    settings = settings_from(args)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    systems = len(settings.base_systems) + len(settings.queue_waits_s)
    total = len(settings.seeds) * len(settings.scenarios) * systems
    with tqdm(total=total, unit="run") as bar:
        summary = run_benchmark(args.out, settings, progress=bar.write,
                                on_run=lambda: bar.update(1))
    summary["command"] = "python -m benchmarks.live_slo " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_all(summary, args.out)
    print(console_table(summary))
    print(f"\nwrote summary.json, {', '.join(FIGURES)} to {args.out} "
          f"in {time.perf_counter() - started:.0f} s")
    return summary


if __name__ == "__main__":
    main()
