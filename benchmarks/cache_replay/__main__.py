"""``python -m benchmarks.cache_replay``: prefix-cache hit rate of eviction policies vs OPT.

Example:

    python -m benchmarks.cache_replay --trace mooncake-conv \\
        --cache-blocks 500 1000 2000 4000 8000 --policies lru,slru,opt --out out/cache

Writes ``OUT/summary.json`` (``{"trace", "results": [{"policy", "cache_blocks",
"hit_rate", ...}], "gap_closed"}``), ``OUT/hit_rate.png`` and prints a table.
Policies: ``lru`` (vLLM's order), ``slru`` (`SegmentedLRU` with its defaults),
``opt`` (Belady's offline optimum).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import attrs

from benchmarks.cache_replay.restart import replay_restart
from benchmarks.cache_replay.simulate import ReplayResult, replay_opt, replay_order
from benchmarks.replay.workloads import load_workload
from policies.eviction import LRU, SegmentedLRU

ORDERS: dict[str, Callable[[], object]] = {"lru": LRU, "slru": SegmentedLRU}
POLICIES = (*ORDERS, "opt")


def run(chains: list, cache_blocks: int, policy: str) -> ReplayResult:
    """One policy at one size (``policy`` in `POLICIES`)."""
    if policy == "opt":
        return replay_opt(chains, cache_blocks)
    if policy not in ORDERS:
        raise ValueError(f"unknown policy {policy!r}: use {', '.join(POLICIES)}")
    return replay_order(chains, cache_blocks, ORDERS[policy](), policy)


def gap_closed(results: list[ReplayResult], policy: str = "slru") -> dict[str, float]:
    """Per size: (policy - lru) / (opt - lru), where all three ran."""
    by = {(r.policy, r.cache_blocks): r.hit_rate for r in results}
    out = {}
    for (name, size), rate in sorted(by.items()):
        lru, opt = by.get(("lru", size)), by.get(("opt", size))
        if name == policy and lru is not None and opt is not None and opt > lru:
            out[str(size)] = (rate - lru) / (opt - lru)
    return out


def plot(results: list[ReplayResult], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(r.policy for r in results):
        rows = sorted((r.cache_blocks, r.hit_rate) for r in results if r.policy == policy)
        ax.plot([s for s, _ in rows], [100 * h for _, h in rows], marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("cache size (blocks)")
    ax.set_ylabel("prefix-cache hit rate (% of prompt blocks)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conv", help="built-in name or file path")
    parser.add_argument("--format", default="auto", help="auto, jsonl, azure or mooncake")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--cache-blocks", type=int, nargs="+", default=[2000])
    parser.add_argument("--policies", default="lru,slru,opt")
    parser.add_argument("--restart-at", type=float, default=None,
                        help="also restart the engine at this fraction of the trace and compare "
                             "a cold cache with one warmed by PrefixWarmer (see `restart`)")
    parser.add_argument("--window", type=int, default=500,
                        help="requests measured after the restart")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in POLICIES:
            raise SystemExit(f"unknown policy {policy!r}: use {', '.join(POLICIES)}")
    trace = load_workload(args.trace, format=args.format, max_requests=args.max_requests)
    chains = [request.block_hashes for request in trace.requests]
    if not any(chains):
        raise SystemExit(f"trace {trace.name} has no block_hashes")
    results = [run(chains, size, policy) for size in args.cache_blocks for policy in policies]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"trace": trace.name, "block_size": trace.block_size,
               "requests": len(chains), "results": [attrs.asdict(r) for r in results],
               "gap_closed": gap_closed(results)}
    if args.restart_at is not None:
        restart_index = int(len(chains) * args.restart_at)
        arrivals = [request.arrival_s for request in trace.requests]
        summary["restart"] = [attrs.asdict(replay_restart(
            chains, arrivals, size, restart_index=restart_index, window=args.window))
            for size in args.cache_blocks]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(results, args.out / "hit_rate.png", f"{trace.name}: hit rate vs cache size")
    print(f"{'cache_blocks':>12}" + "".join(f"{p:>9}" for p in policies))
    for size in args.cache_blocks:
        rates = {r.policy: r.hit_rate for r in results if r.cache_blocks == size}
        print(f"{size:>12}" + "".join(f"{100 * rates[p]:>8.2f}%" for p in policies))
    for row in summary.get("restart", []):
        print(f"restart at request {row['restart_index']}, next {row['window']} requests, "
              f"{row['cache_blocks']} blocks: cold {100 * row['cold_hit_rate']:.2f}% -> warmed "
              f"{100 * row['warmed_hit_rate']:.2f}% ({row['warm_prefixes']} prefixes, "
              f"{row['warm_blocks']} blocks prefilled)")
    print(f"\nwrote summary.json and hit_rate.png to {args.out}")
    return summary


if __name__ == "__main__":
    main()
