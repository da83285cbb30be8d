"""``python -m benchmarks.cache_replay``: prefix-cache hit rate of eviction policies vs OPT.

Example:

    python -m benchmarks.cache_replay --trace mooncake-conv \\
        --cache-blocks 500 1000 2000 4000 8000 --policies lru,slru,opt --out out/cache
    python -m benchmarks.cache_replay --trace azure-conv --prefix-model enterprise \\
        --cache-blocks 2000 4000 8000 --policies lru,shipped,opt --out out/cache-azure

Writes ``OUT/summary.json`` (``{"trace", "results": [{"policy", "cache_blocks",
"hit_rate", ...}], "gap_closed": {policy: {cache_blocks: fraction}}}``),
``OUT/hit_rate.png`` and prints a table. Policies: ``lru`` (vLLM's order), ``slru``
(`SegmentedLRU` with its defaults), ``shipped`` (the order the ``cache`` preset ships,
read from `integrations.vllm_v1.config.presets`, so the comparison measures the
product), the adaptive candidates of `benchmarks.cache_replay.candidates` (``arc``,
``lecar``, ``lecar-crlfu``, ``density``), ``opt`` (Belady's offline optimum).
``--waiting N`` queues the next N requests behind each one served and tells an order with
waiting-queue awareness (`SegmentedLRU.keep_waiting`: ``slru``, ``dueling*``, ``shipped``)
their blocks; 0 (the default) is off. ``--slice START:STOP`` replays a window of the trace's requests; ``--prefix-model
enterprise`` gives a trace without prefix hashes (Azure) the chains of
`benchmarks.cache_replay.prefix_models`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import attrs

from benchmarks.cache_replay.candidates import AdaptiveSegmentedLRU, LeCaR, ReuseDensity
from benchmarks.cache_replay.prefix_models import PREFIX_MODELS, enterprise_chains
from benchmarks.cache_replay.restart import replay_restart
from benchmarks.cache_replay.simulate import ReplayResult, replay_opt, replay_order
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.config.presets import preset
from policies.kv.eviction import LRU, DuelingSLRU, EvictionOrder, SegmentedLRU, SessionPins

SHIPPED_PRESET = "cache"
"""The preset whose eviction order ``--policies shipped`` runs."""


def shipped_order() -> EvictionOrder:
    """A fresh copy of the eviction order the `SHIPPED_PRESET` preset ships.

    Raises:
        ValueError: if that preset has no eviction order.
    """
    order = preset(SHIPPED_PRESET).eviction
    if order is None:
        raise ValueError(f"the {SHIPPED_PRESET!r} preset ships no eviction order")
    return order


ORDERS: dict[str, Callable[[], EvictionOrder]] = {
    "lru": LRU, "slru": SegmentedLRU, "dueling": DuelingSLRU,
    "dueling-pins": lambda: DuelingSLRU(session_pins=SessionPins()),
    "dueling-prefix-pins": lambda: DuelingSLRU(session_pins=SessionPins(prefix_sessions=True)),
    "shipped": shipped_order,
    "arc": AdaptiveSegmentedLRU, "lecar": LeCaR,
    "lecar-crlfu": lambda: LeCaR(churn_resistant=True), "density": ReuseDensity}
POLICIES = (*ORDERS, "opt")


def run(chains: list, cache_blocks: int, policy: str, turns: list | None = None,
        waiting: int = 0) -> ReplayResult:
    """One policy at one size (``policy`` in `POLICIES`); ``turns`` are the requests'
    ``(session_id, arrival_s)``, heard by an order with session pins; ``waiting`` the
    queue depth an order with waiting-queue awareness hears (0: off)."""
    if policy == "opt":
        return replay_opt(chains, cache_blocks)
    if policy not in ORDERS:
        raise ValueError(f"unknown policy {policy!r}: use {', '.join(POLICIES)}")
    return replay_order(chains, cache_blocks, ORDERS[policy](), policy, turns=turns,
                        waiting=waiting)


def gap_closed(results: list[ReplayResult], policy: str = "slru") -> dict[str, float]:
    """Per size: (policy - lru) / (opt - lru), where all three ran and OPT beats LRU."""
    by = {(r.policy, r.cache_blocks): r.hit_rate for r in results}
    out = {}
    for (name, size), rate in sorted(by.items()):
        lru, opt = by.get(("lru", size)), by.get(("opt", size))
        if name == policy and lru is not None and opt is not None and opt > lru:
            out[str(size)] = (rate - lru) / (opt - lru)
    return out


def gaps_closed(results: list[ReplayResult]) -> dict[str, dict[str, float]]:
    """`gap_closed` of every policy but ``lru`` and ``opt``, by policy."""
    names = dict.fromkeys(r.policy for r in results if r.policy not in ("lru", "opt"))
    return {name: gap_closed(results, name) for name in names}


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
    parser.add_argument("--slice", default=None, metavar="START:STOP",
                        help="replay only requests START..STOP-1 (by arrival; either may be "
                             "empty), e.g. a later window of the trace")
    parser.add_argument("--prefix-model", choices=PREFIX_MODELS, default=None,
                        help="block chains for a trace without prefix hashes (Azure)")
    parser.add_argument("--cache-blocks", type=int, nargs="+", default=[2000])
    parser.add_argument("--policies", default="lru,slru,opt")
    parser.add_argument("--restart-at", type=float, default=None,
                        help="also restart the engine at this fraction of the trace and compare "
                             "a cold cache with one warmed by PrefixWarmer (see `restart`)")
    parser.add_argument("--window", type=int, default=500,
                        help="requests measured after the restart")
    parser.add_argument("--waiting", type=int, default=0, metavar="N",
                        help="requests queued behind each one served, told to orders with "
                             "waiting-queue awareness (0: off)")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in POLICIES:
            raise SystemExit(f"unknown policy {policy!r}: use {', '.join(POLICIES)}")
    trace = load_workload(args.trace, format=args.format, max_requests=args.max_requests)
    if args.slice is not None:
        trace = attrs.evolve(trace, requests=trace.requests[_slice(args.slice)])
    if args.prefix_model == "enterprise":
        chains = enterprise_chains(trace)
    else:
        chains = [request.block_hashes for request in trace.requests]
    if not any(chains):
        raise SystemExit(f"trace {trace.name} has no block_hashes (try --prefix-model)")
    turns = [(request.session_id, request.arrival_s) for request in trace.requests]
    results = [run(chains, size, policy, turns, args.waiting)
               for size in args.cache_blocks for policy in policies]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"trace": trace.name, "slice": args.slice, "prefix_model": args.prefix_model,
               "waiting": args.waiting,
               "block_size": 16 if args.prefix_model else trace.block_size,
               "requests": len(chains), "results": [attrs.asdict(r) for r in results],
               "gap_closed": gaps_closed(results)}
    if args.restart_at is not None:
        restart_index = int(len(chains) * args.restart_at)
        arrivals = [request.arrival_s for request in trace.requests]
        summary["restart"] = [attrs.asdict(replay_restart(
            chains, arrivals, size, restart_index=restart_index, window=args.window))
            for size in args.cache_blocks]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(results, args.out / "hit_rate.png", f"{trace.name}: hit rate vs cache size")
    print(f"{'cache_blocks':>12}" + "".join(f"{p:>12}" for p in policies))
    for size in args.cache_blocks:
        rates = {r.policy: r.hit_rate for r in results if r.cache_blocks == size}
        print(f"{size:>12}" + "".join(f"{100 * rates[p]:>11.2f}%" for p in policies))
    for policy, gaps in summary["gap_closed"].items():
        if gaps:
            print(f"LRU->OPT gap closed by {policy}: " + ", ".join(
                f"{100 * gap:.1f} % at {size}" for size, gap in gaps.items()))
    for row in summary.get("restart", []):
        print(f"restart at request {row['restart_index']}, next {row['window']} requests, "
              f"{row['cache_blocks']} blocks: cold {100 * row['cold_hit_rate']:.2f}% -> warmed "
              f"{100 * row['warmed_hit_rate']:.2f}% ({row['warm_prefixes']} prefixes, "
              f"{row['warm_blocks']} blocks prefilled)")
    print(f"\nwrote summary.json and hit_rate.png to {args.out}")
    return summary


def _slice(text: str) -> slice:
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise SystemExit(f"--slice expects START:STOP (integers, either may be empty), "
                         f"got {text!r}") from None


if __name__ == "__main__":
    main()
