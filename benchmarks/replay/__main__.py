"""``python -m benchmarks.replay``: compare stock vLLM and pipelines on a real trace.

Example:

    python -m benchmarks.replay --trace azure-conv --tenants servegen --rate-scale 4 \\
        --max-requests 2000 --systems fcfs,priority,pipeline:qos --out out/replay

Writes ``OUT/summary.json`` (config + one summary per system), ``OUT/ttft.png``
and prints a table. ``stock+queue-caps`` in ``--systems`` replays every setting of
`benchmarks.replay.systems.QUEUE_CAPS_SWEEP` (vLLM's ``max_num_queued_reqs`` /
``max_num_queued_tokens`` on stock ``fcfs`` or ``priority``) and reports the best by goodput
under that name; the whole sweep goes to ``summary.json["queue_caps_sweep"]``, and
``summary.json["targets"]`` judges the decode-protection targets (`benchmarks.replay.targets`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import attrs
from tqdm import tqdm

from benchmarks.replay.calibrate import load_cost_model
from benchmarks.replay.cli import add_run_arguments, engine_shape
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.plots import plot_engine, plot_tenant_service, plot_ttft
from benchmarks.replay.systems import (
    QUEUE_CAPS,
    QUEUE_CAPS_SWEEP,
    QueueCaps,
    best_queue_caps,
    build_system,
    expand_systems,
)
from benchmarks.replay.targets import decode_protection_targets, format_targets
from benchmarks.replay.trace import Trace
from benchmarks.replay.workloads import TENANT_WEIGHTS, load_workload

PRODUCT_SYSTEM = "pipeline:slo"
"""The product's ``slo`` preset as a replay system (named in ``summary.json`` when replayed)."""
TENANT_PRIORITIES = {"t0": -1, "t1": -1, "t2": 0, "t3": 0, "t4": 0, "t5": 1, "t6": 1}
"""``--tenants servegen``: the two busiest tenants are Gold (-1), three Silver (0), two Bronze (1)."""


def with_tenant_priorities(trace: Trace) -> Trace:
    """Give each request its tenant's priority tier."""
    return attrs.evolve(trace, requests=tuple(
        attrs.evolve(r, priority=TENANT_PRIORITIES.get(r.tenant or "", 0))
        for r in trace.requests))


def skip_requests(trace: Trace, n: int) -> Trace:
    """``trace`` without its first ``n`` requests, arrivals shifted so the next one is at 0.

    Tenants are assigned before the cut, so a request keeps the tenant it has in the whole
    trace; deadlines and cancellations are relative to arrival and move with it.
    """
    if n == 0:
        return trace
    kept = trace.requests[n:]
    if not kept:
        raise SystemExit(f"--skip-requests {n} leaves no request of {len(trace.requests)}")
    origin = kept[0].arrival_s
    return attrs.evolve(trace, requests=tuple(
        attrs.evolve(r, arrival_s=r.arrival_s - origin) for r in kept))


def parse_overrides(items: list[str]) -> dict[str, float | int]:
    """``KEY=VALUE`` pairs for cost-model fields (integers stay integers, e.g. ``num_layers``)."""
    overrides: dict[str, float | int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--cost expects KEY=VALUE, got {item!r}")
        overrides[key] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-conv", help="built-in name or file path")
    parser.add_argument("--format", default="auto", help="auto, jsonl, azure or mooncake")
    parser.add_argument("--tenants", choices=["none", "servegen"], default="none")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tenant assignment")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--skip-requests", type=int, default=0, metavar="N",
                        help="drop the first N requests by arrival and start the clock at the "
                             "next one (a later window of the trace; --max-requests counts "
                             "after the skipped ones)")
    parser.add_argument("--systems", default="fcfs,priority,pipeline:qos",
                        help="comma-separated: fcfs, priority, pipeline:NAME|module:attr|file.py:attr, "
                             f"{QUEUE_CAPS} (a sweep, the best reported) or "
                             f"{QUEUE_CAPS}:BASE[:reqs=N][:tokens=N] (one setting)")
    parser.add_argument("--cost-model", type=Path,
                        help="cost_model.json from benchmarks.replay.calibrate (replaces --gpu)")
    parser.add_argument("--cost", action="append", default=[], metavar="KEY=VALUE",
                        help="override a StepCostModel coefficient (seconds)")
    parser.add_argument("--max-tokens", choices=["output", "context"], default="output",
                        help="what clients send as max_tokens: each answer's length (policies "
                             "see it), or none (vLLM's default, the rest of the context; "
                             "answers end with a stop token, as a live model's would)")
    add_run_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.skip_requests < 0:
        raise SystemExit(f"--skip-requests must be >= 0, got {args.skip_requests}")
    limit = None if args.max_requests is None else args.skip_requests + args.max_requests
    trace = load_workload(args.trace, format=args.format, max_requests=limit)
    if args.tenants == "servegen":
        trace = with_tenant_priorities(assign_servegen_tenants(trace, seed=args.seed))
    trace = skip_requests(trace, args.skip_requests)
    trace = trace.scaled(args.rate_scale)
    base = load_cost_model(args.cost_model) if args.cost_model else StepCostModel.preset(args.gpu)
    cost_model = attrs.evolve(base, **parse_overrides(args.cost))
    shape = engine_shape(args)
    requested = args.systems.split(",")
    summaries, runs = {}, {}
    for system in expand_systems(requested):
        with tqdm(total=len(trace.requests), desc=system, unit="req") as bar:
            run = replay(trace, system, shape=shape, cost_model=cost_model, progress=bar.update,
                         harness=build_system(system, shape), max_tokens=args.max_tokens)
        runs[system] = run
        summaries[system] = summarize(run, weights=TENANT_WEIGHTS)
    sweep = None
    if QUEUE_CAPS in requested:
        sweep = queue_caps_sweep(summaries)
        best = sweep["best"]
        runs[QUEUE_CAPS] = attrs.evolve(runs[best], system=QUEUE_CAPS)
        summaries[QUEUE_CAPS] = {**summaries[best], "system": QUEUE_CAPS, "setting": best}
    shown = [s for s in requested if s in summaries]
    args.out.mkdir(parents=True, exist_ok=True)
    config = {"requests": len(trace.requests), "skip_requests": args.skip_requests,
              "rate_scale": args.rate_scale, "max_tokens": args.max_tokens,
              "tenants": args.tenants, "seed": args.seed, "gpu": args.gpu,
              "cost_model": attrs.asdict(cost_model), "engine": attrs.asdict(shape)}
    summary = {"trace": trace.name, "config": config,
               "systems": {s: summaries[s] for s in shown}}
    if PRODUCT_SYSTEM in shown:
        summary["product_preset"] = PRODUCT_SYSTEM
    if sweep is not None:
        summary["queue_caps_sweep"] = sweep
    summary["targets"] = decode_protection_targets(summary)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plotted = [runs[s] for s in shown]
    plot_ttft(plotted, args.out / "ttft.png")
    plot_engine(plotted, args.out / "engine.png")
    plot_tenant_service(plotted, args.out / "tenant_service.png")
    print(format_table([summaries[s] for s in shown]))
    if sweep is not None:
        print(f"\n{QUEUE_CAPS} sweep (best by goodput, then admitted SLO attainment: "
              f"{sweep['best']})")
        print(format_table([summaries[row["setting"]] for row in sweep["settings"]]))
    if summary["targets"]:
        print("\n" + format_targets(summary["targets"]))
    print(f"\nwrote summary.json, ttft.png, engine.png, tenant_service.png to {args.out}")
    return summary


def queue_caps_sweep(summaries: dict[str, dict]) -> dict:
    """The ``stock+queue-caps`` sweep from the replayed settings' summaries: one row per
    setting and the best (highest goodput, then highest admitted SLO attainment)."""
    rows = []
    for caps in QUEUE_CAPS_SWEEP:
        summary = summaries[caps.name]
        overall, by_class = summary["overall"], summary["by_class"]
        top = min(summary["by_priority"], key=int, default=None)
        rows.append({"setting": caps.name, **attrs.asdict(caps),
                     "goodput_rps": overall["goodput_rps"],
                     "slo_attainment": overall["slo_attainment"],
                     "admitted_slo_attainment": overall["admitted_slo_attainment"],
                     "rejected": overall["rejected"],
                     "ttft_p99_s": overall["ttft_p99_s"], "tpot_p99_s": overall["tpot_p99_s"],
                     "short_ttft_p99_s": by_class.get("short", {}).get("ttft_p99_s"),
                     "long_ttft_p99_s": by_class.get("long", {}).get("ttft_p99_s"),
                     "short_itl_jitter": by_class.get("short", {}).get("itl_jitter"),
                     "top_priority_tpot_p99_s": None if top is None
                     else summary["by_priority"][top]["tpot_p99_s"]})
    best = best_queue_caps({r["setting"]: (r["goodput_rps"], r["admitted_slo_attainment"])
                            for r in rows})
    return {"settings": rows, "best": best, "criterion": "goodput_rps, admitted_slo_attainment",
            "best_setting": attrs.asdict(QueueCaps.parse(best))}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def format_table(summaries: list[dict]) -> str:
    """A fixed-width table of the headline numbers, one row per system."""
    header = (f"{'system':<36}{'done':>6}{'rej':>5}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'short p99':>11}{'long p99':>10}{'TPOT p99':>10}{'SLO %':>7}{'goodput':>9}"
              f"{'Jain':>6}{'preempt':>8}")
    lines = [header + "   (times in ms)", "-" * len(header)]
    for s in summaries:
        o, c = s["overall"], s["by_class"]
        jain = s["fairness"]["jain_mean"]
        lines.append(
            f"{s['system']:<36}{o['completed']:>6}{o['rejected']:>5}{_ms(o['ttft_p50_s']):>10}"
            f"{_ms(o['ttft_p99_s']):>10}{_ms(c.get('short', {}).get('ttft_p99_s')):>11}"
            f"{_ms(c.get('long', {}).get('ttft_p99_s')):>10}{_ms(o['tpot_p99_s']):>10}"
            f"{100 * (o['slo_attainment'] or 0):>7.1f}{o['goodput_rps'] or 0:>9.2f}"
            f"{'-' if jain is None else f'{jain:.3f}':>6}{s['preemptions']:>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
