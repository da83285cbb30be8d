"""``python -m benchmarks.pd_replay``: PD routers on a trace, against a colocated cluster.

Example (every router, two cluster sizes, the PD-aware presets):

    python -m benchmarks.pd_replay --trace mooncake-conv \\
        --routers round_robin,pow2,prefix_affinity,kv_overlap,pd_router \\
        --topologies 2P2D,4P4D --scheduling pd --out out/pd

Routers: ``round_robin``, ``least_loaded`` and ``pd_router`` (`policies.pd.router`),
and the routers users would pick instead (`benchmarks.pd_replay.routers`): ``pow2``
(Ray Serve's default), ``prefix_affinity`` (Ray Serve LLM's prefix-cache affinity)
and ``kv_overlap`` (Dynamo's KV cost). ``--scheduling stock,pd`` runs every router
twice: with vLLM's stock scheduler on every instance, and with the PD-aware presets
(`PD_PREFILL` on prefill instances, `PD_DECODE` on decode instances; rows named
``ROUTER+pd``). Each topology also replays a colocated cluster of as many instances
(least-loaded). ``--plan`` instead replays the split `PDPlanner` picks per window
(see `benchmarks.pd_replay.planning`). Writes ``OUT/summary.json`` and plots, and
prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import attrs
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

from benchmarks.pd_replay.cluster import KV_BYTES_PER_TOKEN, ClusterRun, TransferModel
from benchmarks.pd_replay.goodput import DEFAULT_ITL_SLO_S
from benchmarks.pd_replay.planning import format_plan, run_planning
from benchmarks.pd_replay.setup import (
    ROUTERS,
    SCHEDULING,
    ReplaySetup,
    format_table,
    make_router,
    row,
)
from benchmarks.replay.cli import add_engine_shape_arguments, engine_shape
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.trace import Trace
from benchmarks.replay.workloads import load_workload

__all__ = ["ROUTERS", "SCHEDULING", "build_parser", "format_table", "main", "make_router",
           "parse_topologies"]

DEFAULT_ROUTERS = ("round_robin", "least_loaded", "pow2", "prefix_affinity", "kv_overlap",
                   "pd_router")


def parse_topologies(text: str) -> list[tuple[int, int]]:
    """``"2P2D,4P4D"`` -> ``[(2, 2), (4, 4)]`` (prefill, decode instances)."""
    topologies = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)P(\d+)D", part.strip(), flags=re.IGNORECASE)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise SystemExit(f"--topologies: {part!r} is not NPMD with N, M >= 1 (e.g. 2P2D)")
        topologies.append((int(match[1]), int(match[2])))
    return topologies


def trace_window(trace: Trace, skip: int, count: int | None) -> Trace:
    """Requests ``skip`` to ``skip + count`` by arrival (a window of the trace)."""
    end = None if count is None else skip + count
    return attrs.evolve(trace, requests=trace.requests[skip:end])


def plot(results: list[ClusterRun], path: Path, title: str) -> None:
    """TTFT and ITL CDFs per system and KV bytes transferred."""
    fig, (ttft_ax, itl_ax, kv_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = plt.get_cmap("tab20").colors
    for i, result in enumerate(results):
        records = result.run.records
        ttft = np.sort([r.ttft_s for r in records if r.ttft_s is not None])
        gaps = np.sort(np.concatenate([np.diff(r.token_times_s) for r in records]))
        style = {"color": colors[i % len(colors)],
                 "linestyle": "--" if result.system.endswith("+pd") else "-"}
        for ax, values in ((ttft_ax, ttft), (itl_ax, gaps)):
            ax.plot(np.maximum(values, 1e-4), np.arange(1, len(values) + 1) / len(values),
                    label=result.system, **style)
    kv_ax.bar([r.system for r in results], [r.kv_bytes_transferred / 1e9 for r in results],
              color=[colors[i % len(colors)] for i in range(len(results))])
    kv_ax.tick_params(axis="x", labelrotation=40)
    for label in kv_ax.get_xticklabels():
        label.set_horizontalalignment("right")
    for ax, name in ((ttft_ax, "TTFT CDF (s)"), (itl_ax, "inter-token latency CDF (s)")):
        ax.set_xscale("log")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    kv_ax.set_title("KV transferred (GB)")
    itl_ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conv", help="built-in name or file path")
    parser.add_argument("--format", default="auto", help="auto, jsonl, azure or mooncake")
    parser.add_argument("--max-requests", type=int, default=1000)
    parser.add_argument("--skip-requests", type=int, default=0,
                        help="start the window this many requests into the trace")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--prefill", type=int, default=3, help="prefill instances")
    parser.add_argument("--decode", type=int, default=2, help="decode instances")
    parser.add_argument("--topologies", default=None,
                        help="comma-separated NPMD (e.g. 2P2D,4P4D); overrides --prefill/--decode")
    parser.add_argument("--routers", default=",".join(DEFAULT_ROUTERS),
                        help=f"comma-separated, from {', '.join(ROUTERS)}")
    parser.add_argument("--scheduling", default="stock",
                        help="comma-separated: stock (vLLM fcfs), pd (PD-aware presets), "
                             "prefill (the prefill preset, stock decode)")
    parser.add_argument("--no-colocated", action="store_true",
                        help="skip the colocated baseline")
    parser.add_argument("--decode-load", choices=("assigned", "arrived"), default="assigned",
                        help="what a decode instance's load counts: requests routed to it "
                             "(assigned) or only those whose KV reached it (arrived)")
    parser.add_argument("--itl-slo-s", type=float, default=DEFAULT_ITL_SLO_S,
                        help="per-request p99 inter-token gap bound of the ITL-bounded SLO")
    parser.add_argument("--gpu", default="h100", help="cost-model preset: a100, h100, h200")
    parser.add_argument("--link-gbytes-per-s", type=float, default=50.0,
                        help="decode ingress link bandwidth, GB/s")
    parser.add_argument("--kv-dtype", choices=sorted(KV_BYTES_PER_TOKEN), default="bf16",
                        help="KV cache dtype of both pools (fp8: vLLM's --kv-cache-dtype fp8 "
                             "on every instance), which sets the bytes sent per token")
    plan = parser.add_argument_group("planning (--plan)")
    plan.add_argument("--plan", action="store_true",
                      help="replay the P:D split PDPlanner picks per window, against colocated")
    plan.add_argument("--instances", type=int, default=None,
                      help="instances to plan (default: the first topology's total)")
    plan.add_argument("--plan-window-s", type=float, default=120.0)
    plan.add_argument("--plan-router", default="pd_router", help="router of the planned split")
    plan.add_argument("--plan-itl-slo", action=argparse.BooleanOptionalAction, default=True,
                      help="plan for the ITL-bounded SLO (else throughput alone)")
    plan.add_argument("--static-splits", action="store_true",
                      help="also replay every fixed split of the instances")
    add_engine_shape_arguments(parser, max_model_len=131072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def _setup(args: argparse.Namespace, trace: Trace, bar: tqdm) -> ReplaySetup:
    shape = engine_shape(args)
    router_block = trace.block_size or args.block_size
    return ReplaySetup(
        cost_model=StepCostModel.preset(args.gpu),
        transfer=TransferModel(link_bytes_per_s=args.link_gbytes_per_s * 1e9,
                               kv_bytes_per_token=KV_BYTES_PER_TOKEN[args.kv_dtype]),
        shape=shape, router_block=router_block,
        index_blocks=args.kv_blocks * args.block_size // router_block, seed=args.seed,
        report_assigned=args.decode_load == "assigned", itl_slo_s=args.itl_slo_s, bar=bar)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    schedulings = args.scheduling.split(",")
    if unknown := set(schedulings) - set(SCHEDULING):
        raise SystemExit(f"unknown --scheduling {sorted(unknown)}; choose from "
                         f"{', '.join(SCHEDULING)}")
    routers = args.routers.split(",")
    if unknown := [r for r in routers if r not in ROUTERS]:
        raise SystemExit(f"unknown --routers {unknown}; choose from {', '.join(ROUTERS)}")
    topologies = (parse_topologies(args.topologies) if args.topologies
                  else [(args.prefill, args.decode)])
    trace = trace_window(load_workload(args.trace, format=args.format),
                         args.skip_requests, args.max_requests).scaled(args.rate_scale)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {"requests": len(trace.requests), "skip_requests": args.skip_requests,
              "rate_scale": args.rate_scale, "gpu": args.gpu, "scheduling": schedulings,
              "decode_load": args.decode_load, "itl_slo_s": args.itl_slo_s,
              "link_gbytes_per_s": args.link_gbytes_per_s, "kv_dtype": args.kv_dtype,
              "engine": attrs.asdict(engine_shape(args))}
    if args.plan:
        instances = args.instances or sum(topologies[0])
        with tqdm(desc="plan", unit="req") as bar:
            summary = run_planning(trace, _setup(args, trace, bar), instances=instances,
                                   window_s=args.plan_window_s, router=args.plan_router,
                                   scheduling=schedulings[0],
                                   itl_slo_s=args.itl_slo_s if args.plan_itl_slo else None,
                                   static_splits=args.static_splits, out=args.out)
        summary = {"trace": trace.name, "config": config, "plan": summary}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(format_plan(summary["plan"]))
        print(f"\nwrote summary.json and plan.png to {args.out}")
        return summary

    runs = len(topologies) * (len(routers) * len(schedulings) + (not args.no_colocated))
    summary: dict = {"trace": trace.name, "config": config, "topologies": {}, "results": []}
    with tqdm(total=runs * len(trace.requests), unit="req") as bar:
        setup = _setup(args, trace, bar)
        for prefill_count, decode_count in topologies:
            topology = f"{prefill_count}P{decode_count}D"
            prefill = [f"prefill{i}" for i in range(prefill_count)]
            decode = [f"decode{i}" for i in range(decode_count)]
            results = [setup.run(trace, f"{name}" if scheduling == "stock"
                                 else f"{name}+{scheduling}", setup.router(name, prefill, decode),
                                 prefill, decode, scheduling, label=topology)
                       for name in routers for scheduling in schedulings]
            rows = [row(r, r.system, setup.itl_slo_s) for r in results]
            entry = {"results": rows}
            if not args.no_colocated:
                everyone = [f"colocated{i}" for i in range(prefill_count + decode_count)]
                colocated = setup.run(trace, "colocated", setup.router("least_loaded", [],
                                                                          everyone),
                                      [], everyone, "stock", label=topology)
                results.append(colocated)
                entry["colocated"] = row(colocated, "colocated:least_loaded", setup.itl_slo_s)
            plot_name = f"pd_{topology}.png"
            plot(results, args.out / plot_name, f"{trace.name}, {topology}")
            entry["plot"] = plot_name
            summary["topologies"][topology] = entry
            summary["results"] += [{"topology": topology, **r} for r in rows]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    for topology, entry in summary["topologies"].items():
        print(f"\n{trace.name}, {topology} ({len(trace.requests)} requests)")
        print(format_table(entry["results"] + ([entry["colocated"]] if "colocated" in entry
                                               else [])))
    print(f"\nwrote summary.json and plots to {args.out}")
    return summary


if __name__ == "__main__":
    main()
