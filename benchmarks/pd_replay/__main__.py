"""``python -m benchmarks.pd_replay``: PD routers on a trace, against a colocated cluster.

Example:

    python -m benchmarks.pd_replay --trace mooncake-conv --prefill 3 --decode 2 \\
        --routers round_robin,least_loaded,pd_router --max-requests 1000 --out out/pd

``--scheduling stock,pd`` runs every router twice: with vLLM's stock scheduler on
every instance, and with the PD-aware presets (`PD_PREFILL` on prefill instances,
`PD_DECODE` on decode instances; rows named ``ROUTER+pd``). Writes
``OUT/summary.json`` (one row per router and scheduling plus the colocated
baseline with the same GPU count) and ``OUT/pd.png``, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path

import attrs
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

from benchmarks.pd_replay.cluster import (
    KV_BYTES_PER_TOKEN,
    ClusterRun,
    TransferModel,
    run_cluster,
)
from benchmarks.replay.cli import add_engine_shape_arguments, engine_shape
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import load_trace
from benchmarks.replay.metrics import DEFAULT_SLOS, latency_summary
from integrations.vllm_v1.pd.roles import PD_DECODE, PD_PREFILL, STOCK
from policies.pd_router import LeastLoadedRouter, PDRouter, RoundRobinRouter

ROUTERS = ("round_robin", "least_loaded", "pd_router")
SCHEDULING = {"stock": (STOCK, STOCK), "pd": (PD_PREFILL, PD_DECODE)}
"""Prefill and decode roles by ``--scheduling`` name."""
ROW_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "goodput_rps")


def make_router(name: str, prefill: list[str], decode: list[str], *, block_size: int,
                kv_blocks: int, seed: int):
    """``round_robin``, ``least_loaded`` or ``pd_router`` over the two pools."""
    if name == "round_robin":
        return RoundRobinRouter(prefill=prefill, decode=decode)
    if name == "least_loaded":
        return LeastLoadedRouter(prefill=prefill, decode=decode)
    if name == "pd_router":
        return PDRouter(prefill=prefill, decode=decode, block_size_tokens=block_size,
                        rng=random.Random(seed), index_capacity_blocks=kv_blocks)
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")


def row(result: ClusterRun, router: str) -> dict:
    """The summary row of one cluster run (the issue's keys first, then extras)."""
    run = result.run
    duration = run.makespan_s - min(r.arrival_s for r in run.records)
    overall = latency_summary(run.records, DEFAULT_SLOS, duration)
    return {"router": router, **{k: overall[k] for k in ROW_KEYS},
            "kv_bytes_transferred": result.kv_bytes_transferred,
            "kv_bytes_full_prompts": result.kv_bytes_full_prompts,
            "completed": overall["completed"], "ttft_p90_s": overall["ttft_p90_s"],
            "itl_jitter": overall["itl_jitter"], "slo_attainment": overall["slo_attainment"],
            "transfers": result.transfers, "skipped_prefill": result.skipped_prefill,
            "prefix_hit_rate": overall["prefix_hit_rate"], "preemptions": run.preemptions,
            "wall_s": run.wall_s}


def plot(results: list[ClusterRun], path: Path) -> None:
    """TTFT and ITL CDFs per system and KV bytes transferred."""
    fig, (ttft_ax, itl_ax, kv_ax) = plt.subplots(1, 3, figsize=(15, 3.8))
    for result in results:
        records = result.run.records
        ttft = np.sort([r.ttft_s for r in records if r.ttft_s is not None])
        gaps = np.sort(np.concatenate([np.diff(r.token_times_s) for r in records]))
        for ax, values in ((ttft_ax, ttft), (itl_ax, gaps)):
            ax.plot(np.maximum(values, 1e-4), np.arange(1, len(values) + 1) / len(values),
                    label=result.system)
    kv_ax.bar([r.system for r in results], [r.kv_bytes_transferred / 1e9 for r in results])
    kv_ax.tick_params(axis="x", labelrotation=20)
    for ax, title in ((ttft_ax, "TTFT CDF (s)"), (itl_ax, "inter-token latency CDF (s)")):
        ax.set_xscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    kv_ax.set_title("KV transferred (GB)")
    itl_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conv", help="built-in name or file path")
    parser.add_argument("--format", default="auto", help="auto, jsonl, azure or mooncake")
    parser.add_argument("--max-requests", type=int, default=1000)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--prefill", type=int, default=3, help="prefill instances")
    parser.add_argument("--decode", type=int, default=2, help="decode instances")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--scheduling", default="stock",
                        help="comma-separated: stock (vLLM fcfs) and/or pd (PD-aware presets)")
    parser.add_argument("--no-colocated", action="store_true",
                        help="skip the colocated baseline")
    parser.add_argument("--gpu", default="h100", help="cost-model preset: a100, h100, h200")
    parser.add_argument("--link-gbytes-per-s", type=float, default=50.0,
                        help="decode ingress link bandwidth, GB/s")
    parser.add_argument("--kv-dtype", choices=sorted(KV_BYTES_PER_TOKEN), default="bf16",
                        help="KV cache dtype of both pools (fp8: vLLM's --kv-cache-dtype fp8 "
                             "on every instance), which sets the bytes sent per token")
    add_engine_shape_arguments(parser, max_model_len=131072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    trace = load_trace(args.trace, format=args.format,
                       max_requests=args.max_requests).scaled(args.rate_scale)
    cost_model = StepCostModel.preset(args.gpu)
    transfer = TransferModel(link_bytes_per_s=args.link_gbytes_per_s * 1e9,
                             kv_bytes_per_token=KV_BYTES_PER_TOKEN[args.kv_dtype])
    shape = engine_shape(args)
    # A decode instance installs a transferred prompt in one step, as a connector load does.
    decode_shape = attrs.evolve(shape, max_num_batched_tokens=args.max_model_len)
    prefill = [f"prefill{i}" for i in range(args.prefill)]
    decode = [f"decode{i}" for i in range(args.decode)]
    router_block = trace.block_size or args.block_size

    def cluster(system: str, router, prefill_pool, decode_pool, decode_engine,
                scheduling: str = "stock") -> ClusterRun:
        prefill_role, decode_role = SCHEDULING[scheduling]
        with tqdm(total=len(trace.requests), desc=system, unit="req") as bar:
            return run_cluster(trace, router, system, prefill=prefill_pool, decode=decode_pool,
                               prefill_shape=shape, decode_shape=decode_engine,
                               cost_model=cost_model, transfer=transfer,
                               prefill_role=prefill_role, decode_role=decode_role,
                               progress=bar.update)

    schedulings = args.scheduling.split(",")
    if unknown := set(schedulings) - set(SCHEDULING):
        raise SystemExit(f"unknown --scheduling {sorted(unknown)}; choose from stock, pd")
    results = [cluster(name if scheduling == "stock" else f"{name}+{scheduling}",
                       make_router(name, prefill, decode, block_size=router_block,
                                   kv_blocks=args.kv_blocks * args.block_size // router_block,
                                   seed=args.seed),
                       prefill, decode, decode_shape, scheduling)
               for name in args.routers.split(",") for scheduling in schedulings]
    summary = {"trace": trace.name, "config": {
        "requests": len(trace.requests), "rate_scale": args.rate_scale,
        "prefill": args.prefill, "decode": args.decode, "gpu": args.gpu,
        "scheduling": schedulings,
        "transfer": attrs.asdict(transfer), "engine": attrs.asdict(shape)},
        "results": [row(r, r.system) for r in results]}
    if not args.no_colocated:
        everyone = [f"colocated{i}" for i in range(args.prefill + args.decode)]
        colocated = cluster("colocated", LeastLoadedRouter(prefill=(), decode=everyone), [],
                            everyone, shape)
        results.append(colocated)
        summary["colocated"] = row(colocated, "colocated:least_loaded")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(results, args.out / "pd.png")
    print(format_table(summary["results"] + ([summary["colocated"]] if "colocated" in summary
                                             else [])))
    print(f"\nwrote summary.json and pd.png to {args.out}")
    return summary


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f}"


def format_table(rows: list[dict]) -> str:
    """One line per router: latency percentiles (ms), goodput, GB of KV sent."""
    header = (f"{'router':<24}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}"
              f"{'p99/p50':>8}{'goodput':>9}{'KV GB':>8}{'skipped':>8}")
    lines = [header + "   (times in ms)", "-" * len(header)]
    for r in rows:
        lines.append(f"{r['router']:<24}{_ms(r['ttft_p50_s']):>10}{_ms(r['ttft_p99_s']):>10}"
                     f"{_ms(r['itl_p50_s']):>9}{_ms(r['itl_p99_s']):>9}"
                     f"{r['itl_jitter'] or 0:>8.2f}"
                     f"{r['goodput_rps'] or 0:>9.2f}{r['kv_bytes_transferred'] / 1e9:>8.1f}"
                     f"{r['skipped_prefill']:>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
