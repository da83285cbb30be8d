"""``python -m benchmarks.cluster_replay``: cluster routers over N replicas, in virtual time.

Example (4 replicas, agent sessions, at 1.5x and 3x the cluster's capacity):

    python -m benchmarks.cluster_replay --trace agent-swe --replicas 4 --load 1.5 3 \\
        --max-requests 800 --out out/cluster

Each ``--routers`` entry is ``ROUTER[@ENGINE]``: the router (`ROUTERS`) in front of one
``ENGINE`` per replica (a replay system: ``pipeline:slo``, ``fcfs``, a
``stock+queue-caps:...`` setting). Without ``@``, ``slo`` runs over ``pipeline:slo`` and
every peer over ``--peer-engine`` (the best stock setting of the single-engine sweep).

Agent-session workloads (``agent-*``) are made heavier by starting sessions more often (the
generator's ``sessions_per_s``), so each session keeps its turns, tool times and prefix reuse;
other traces are offered faster (`Trace.scaled`).

``--trace business-case`` replays the business case's seven tenants and five phases
(`benchmarks.e2e_business_cases`, ``--phase-s`` seconds a phase), judged by its own SLO
classes and tenant weights: our router runs over its product preset (``pipeline+slo``, the
business case's declaration), every peer over its best stock setting (`BUSINESS_PEER_ENGINE`).

With ``--tenants``, the tenants' weights are declared once (`FAIRNESS`, the ``slo``
declaration's ``fairness``) and ``--fairness`` says who applies them: our router across the
cluster, each replica's ``slo`` preset, ``both`` (the default) or neither.

Capacity comes first: the requests per second ``--replicas`` replicas serve when busy,
from the step-cost model (`cost_model_capacity`: each request's prefill of what an ideal
prefix cache would not hold, plus its share of decode steps as large as the KV cache and
``max_num_seqs`` allow). A load of ``L`` offers the trace at ``L`` times that rate.
Writes ``OUT/summary.json`` (config, capacity, one summary per load and system, the goals
judged) and prints a table per load; ``room`` (``router.rejected_with_room``) counts the
replica rejections a router passed on to the client while another replica was predicted to
meet the request's targets.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Callable, Mapping

import attrs
from tqdm import tqdm

from benchmarks.cluster_replay.cluster import ClusterRouter, run_cluster
from benchmarks.e2e_business_cases.slos import KIND_SLOS
from benchmarks.e2e_business_cases.systems import build_system as business_system
from benchmarks.e2e_business_cases.workload import BusinessWorkload, business_workload
from benchmarks.pd_replay.capacity import StepCostCapacity
from benchmarks.replay.__main__ import skip_requests, with_tenant_priorities
from benchmarks.replay.agent_sessions import PROFILES, agent_trace
from benchmarks.replay.cli import add_run_arguments, engine_shape
from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.metrics import DEFAULT_SLOS, SLO, summarize
from benchmarks.replay.trace import Trace
from benchmarks.replay.workloads import AGENT_WORKLOADS, TENANT_WEIGHTS, load_workload
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from policies.cluster_routing import OURS, ROUTERS, make_router
from policies.pd.router import chain_keys

DEFAULT_ROUTERS = ("slo", "pow2", "round-robin", "kv_overlap", "session-sticky",
                   "sticky-until-saturated")
BEST_STOCK = "stock+queue-caps:fcfs:tokens=32768:chunk=512:adaptive"
"""The best stock setting of the single-engine sweep on ``agent-swe`` x4 (the default
``--peer-engine``)."""
FAIRNESS = {"fairness": {"weights": TENANT_WEIGHTS}}
"""With ``--tenants``: the ``llm_serving_policies.slo`` declaration of the tenants' weights
(the built-in workloads': Gold 4, Silver 2, Bronze 1), read by our router (`SLOSpec`'s
``fairness_weights``) and by the ``slo`` preset of every replica behind it."""
BUSINESS_CASE = "business-case"
"""The ``--trace`` of the business case's workload (module doc)."""
BUSINESS_PEER_ENGINE = "stock+queue-caps:priority:reqs=128"
"""The business case's best stock setting on one engine (its results page), behind every peer
router on ``--trace business-case``."""
SATURATION_S = 1.0
"""`StickyUntilSaturated`'s token-load limit: this many seconds of a replica's prefill
throughput (full chunks of ``max_num_batched_tokens``, from the cost model)."""


def cost_model_capacity(trace: Trace, cost_model: StepCostModel, shape: EngineShape,
                        replicas: int) -> dict:
    """Requests per second ``replicas`` busy replicas serve on this trace's mix (module doc)."""
    capacity = StepCostCapacity(cost_model=cost_model,
                                kv_capacity_tokens=shape.num_blocks * shape.block_size,
                                prefill_chunk_tokens=shape.max_num_batched_tokens,
                                colocated_chunk_tokens=shape.max_num_batched_tokens,
                                max_num_seqs=shape.max_num_seqs)
    seen: set[int] = set()
    seconds = 0.0
    cached_total = prompt_total = 0
    for request in trace.requests:
        keys = chain_keys(request.block_hashes)
        hit = next((i for i, key in enumerate(keys) if key not in seen), len(keys))
        seen.update(keys)
        cached = min(hit * (trace.block_size or 0), request.prompt_tokens - 1)
        cached_total += cached
        prompt_total += request.prompt_tokens
        seconds += (capacity.prefill_s(request.prompt_tokens, cached)
                    + capacity.decode_s(request.prompt_tokens, request.output_tokens))
    per_replica = len(trace.requests) / seconds
    return {"replicas": replicas, "capacity_rps": replicas * per_replica,
            "per_replica_rps": per_replica, "ideal_prefix_hit_rate": cached_total / prompt_total,
            "trace_rate_rps": len(trace.requests) / max(trace.duration_s, 1e-9),
            "method": "step-cost model, ideal prefix cache, decode batches as large as KV "
                      "and max_num_seqs allow"}


@attrs.frozen(kw_only=True)
class Judging:
    """What a trace's requests are judged by, and the engines behind the routers."""

    slos: Mapping[str, SLO]
    weights: Mapping[str, float]
    our_engine: str
    """The replicas' engine behind our routers."""
    build: Callable[[str, EngineShape], SchedulerHarness] | None
    """Makes a replica of an engine name (None: `replica_harness`)."""


@functools.cache
def _business_workload(seed: int, phase_s: float) -> BusinessWorkload:
    """The business case's workload, generated once per seed and phase length."""
    return business_workload(seed=seed, phase_s=phase_s)


def judging(args: argparse.Namespace) -> Judging:
    """The business case's classes, weights and systems for ``--trace business-case``; the
    replay's defaults for every other trace."""
    if args.trace == BUSINESS_CASE:
        workload = _business_workload(args.seed, args.phase_s)
        return Judging(slos=KIND_SLOS, weights=workload.weights, our_engine="pipeline+slo",
                       build=business_system)
    return Judging(slos=DEFAULT_SLOS, weights=TENANT_WEIGHTS, our_engine="pipeline:slo",
                   build=None)


def load_trace(args: argparse.Namespace, session_rate_scale: float = 1.0) -> Trace:
    """The workload's window (``--max-requests`` after ``--skip-requests``), tenants assigned;
    an agent workload with its sessions started ``session_rate_scale`` times as often."""
    limit = None if args.max_requests is None else args.skip_requests + args.max_requests
    if args.trace == BUSINESS_CASE:
        trace = _business_workload(args.seed, args.phase_s).trace
        return skip_requests(attrs.evolve(trace, requests=trace.requests[:limit]),
                             args.skip_requests)
    if args.trace in AGENT_WORKLOADS:
        profile = PROFILES[AGENT_WORKLOADS[args.trace]]
        profile = attrs.evolve(profile,
                               sessions_per_s=profile.sessions_per_s * session_rate_scale)
        trace = attrs.evolve(agent_trace(profile, num_requests=limit or 3000, seed=args.seed),
                             name=args.trace)
    else:
        trace = load_workload(args.trace, max_requests=limit)
    if args.tenants == "servegen":
        trace = with_tenant_priorities(assign_servegen_tenants(trace, seed=args.seed))
    return skip_requests(trace, args.skip_requests)


def offered(args: argparse.Namespace, trace: Trace, target_rps: float) -> tuple[Trace, float]:
    """``trace`` offered at about ``target_rps`` and the scale applied: an agent workload
    regenerated with more sessions (one correction for the window's ramp), else scaled."""
    rate = len(trace.requests) / max(trace.duration_s, 1e-9)
    if args.trace not in AGENT_WORKLOADS:
        return trace.scaled(target_rps / rate), target_rps / rate
    scale = target_rps / rate
    for _ in range(2):
        heavier = load_trace(args, scale)
        scale *= target_rps / (len(heavier.requests) / max(heavier.duration_s, 1e-9))
    return load_trace(args, scale), scale


def saturation_tokens(cost_model: StepCostModel, shape: EngineShape) -> int:
    """`SATURATION_S` of prefill at full chunks (the calibrated llm-d limit)."""
    chunk = shape.max_num_batched_tokens
    step = cost_model.step_time_s(StepBatch(prefills=(PrefillChunk(tokens=chunk),)))
    return max(1, round(SATURATION_S * chunk / step))


def parse_system(entry: str, peer_engine: str, our_engine: str = "pipeline:slo"
                 ) -> tuple[str, str]:
    """``ROUTER[@ENGINE]`` -> (router, engine)."""
    router, sep, engine = entry.partition("@")
    if router not in ROUTERS:
        raise SystemExit(f"--routers: unknown router {router!r} (use {', '.join(ROUTERS)})")
    return router, engine if sep else (our_engine if router in OURS else peer_engine)


def slim(summary: dict, run_router: ClusterRouter) -> dict:
    """The numbers the cluster tables report, per system."""
    overall = summary["overall"]
    tenants = summary["by_tenant"]
    met_total = sum(t["goodput_rps"] or 0.0 for t in tenants.values()) or 1.0
    stats = run_router.stats()
    return {
        "system": summary["system"], "offered": summary["offered"],
        "completed": summary["completed"], "rejected": summary["rejected"],
        "met_slo": summary["met_slo"], "goodput_rps": overall["goodput_rps"],
        "goodput_arrival_window_rps": summary["goodput_arrival_window_rps"],
        "slo_attainment": overall["slo_attainment"],
        "admitted_slo_attainment": overall["admitted_slo_attainment"],
        "ttft_p50_s": overall["ttft_p50_s"], "ttft_p99_s": overall["ttft_p99_s"],
        "tpot_p99_s": overall["tpot_p99_s"], "prefix_hit_rate": overall["prefix_hit_rate"],
        "jain": summary["fairness"]["jain_mean"],
        "max_min_share_ratio": summary["fairness"]["max_min_share_ratio"],
        "tenant_goodput_share": {t: (v["goodput_rps"] or 0.0) / met_total
                                 for t, v in tenants.items()},
        "rejections_by_reason": summary["rejections_by_reason"],
        "rejections_with_retry_after": summary["rejections_with_retry_after"],
        "preemptions": summary["preemptions"], "makespan_s": summary["makespan_s"],
        "wall_s": summary["wall_s"],
        "router": {"routed": stats.routed, "rejected": stats.rejected,
                   "by_cause": dict(stats.by_cause), "retries": stats.retries,
                   "retries_placed": stats.retries_placed,
                   "rejected_with_room": stats.rejected_with_room,
                   "over_share_routed": stats.over_share_routed,
                   "over_share_rejected": stats.over_share_rejected,
                   "by_replica": dict(stats.by_replica)},
    }


def judge(systems: dict[str, dict], *, goodput_goal: float, tenants: bool) -> dict:
    """The goals for each of our routers against the best peer router of the same load.

    ``goodput_ratio`` divides requests in SLO by each run's makespan (the drain of the last
    answers included) and compares with the peer of the highest; ``met_slo_ratio`` compares
    the counts with the peer of the most (goodput over the arrival window, the same for
    every system of a load)."""
    ours = {n: s for n, s in systems.items() if n.split("@")[0] in OURS}
    peers = {n: s for n, s in systems.items() if n not in ours}
    if not peers:
        return {}
    return {name: _goals(system, peers, goodput_goal=goodput_goal, tenants=tenants)
            for name, system in ours.items()}


def _goals(ours: dict, peers: dict[str, dict], *, goodput_goal: float, tenants: bool) -> dict:
    best_name = max(peers, key=lambda n: (peers[n]["goodput_rps"] or 0.0))
    best = peers[best_name]
    ratio = (ours["goodput_rps"] or 0.0) / best["goodput_rps"] if best["goodput_rps"] else None
    most = max(p["met_slo"] for p in peers.values())
    goals = {"best_peer": best_name, "goodput_ratio": ratio, "goodput_goal": goodput_goal,
             "goodput_met": ratio is not None and ratio >= goodput_goal,
             "met_slo_ratio": ours["met_slo"] / most if most else None,
             "admitted_slo_attainment": ours["admitted_slo_attainment"],
             "admitted_met": (ours["admitted_slo_attainment"] or 0.0) >= 0.95}
    sticky = next((s for n, s in peers.items() if n.startswith("session-sticky@")), None)
    if sticky is not None:
        goals["prefix_hit_rate"] = ours["prefix_hit_rate"]
        goals["session_sticky_hit_rate"] = sticky["prefix_hit_rate"]
        goals["hit_rate_met"] = ours["prefix_hit_rate"] >= sticky["prefix_hit_rate"] - 0.01
    if tenants:
        goals["jain"] = ours["jain"]
        goals["jain_met"] = ours["jain"] is not None and ours["jain"] >= 0.95
    return goals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="agent-swe", help="built-in name or file path")
    parser.add_argument("--tenants", choices=["none", "servegen"], default="none")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the tenant assignment and the random routers")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--load", type=float, nargs="+", default=[1.5, 3.0],
                        help="offered load, in multiples of the cluster's capacity")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--skip-requests", type=int, default=0, metavar="N")
    parser.add_argument("--routers", default=",".join(DEFAULT_ROUTERS),
                        help="comma-separated ROUTER[@ENGINE] (see the module doc)")
    parser.add_argument("--peer-engine", default=None,
                        help="the replicas' engine behind every peer router (default: the "
                             f"best stock setting, {BEST_STOCK}; on {BUSINESS_CASE}, "
                             f"{BUSINESS_PEER_ENGINE})")
    parser.add_argument("--phase-s", type=float, default=60.0,
                        help=f"seconds a phase of --trace {BUSINESS_CASE}")
    parser.add_argument("--fairness", choices=["both", "router", "replicas", "off"],
                        default="both",
                        help="with --tenants, where the FAIRNESS declaration applies: our "
                             "router (charges across the cluster), each replica's slo preset "
                             "(its own charges), both, or neither")
    parser.add_argument("--goodput-goal", type=float, default=1.2,
                        help="goodput of slo over the best peer to count as met")
    add_run_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.replicas < 1:
        raise SystemExit(f"--replicas must be >= 1, got {args.replicas}")
    if args.trace == BUSINESS_CASE and args.tenants != "none":
        raise SystemExit(f"--tenants: {BUSINESS_CASE} has its own tenants")
    if not args.phase_s > 0:
        raise SystemExit(f"--phase-s must be > 0, got {args.phase_s}")
    judged = judging(args)
    peer_engine = args.peer_engine or (
        BUSINESS_PEER_ENGINE if args.trace == BUSINESS_CASE else BEST_STOCK)
    trace = load_trace(args)
    cost_model = StepCostModel.preset(args.gpu)
    shape = engine_shape(args)
    capacity = cost_model_capacity(trace, cost_model, shape, args.replicas)
    print(f"capacity: {capacity['capacity_rps']:.2f} req/s for {args.replicas} replicas "
          f"(trace offers {capacity['trace_rate_rps']:.2f} req/s)")
    systems = [parse_system(e, peer_engine, judged.our_engine)
               for e in args.routers.split(",")]
    names = [f"r{i}" for i in range(args.replicas)]
    block = trace.block_size or shape.block_size
    saturation = saturation_tokens(cost_model, shape)
    fair = args.tenants != "none" and args.fairness != "off"
    spec = SLOSpec.parse(FAIRNESS) if fair and args.fairness != "replicas" else SLOSpec()
    replica_slo = FAIRNESS if fair and args.fairness != "router" else None
    summary = {"trace": trace.name, "config": {
        "requests": len(trace.requests), "skip_requests": args.skip_requests,
        "tenants": args.tenants, "seed": args.seed, "gpu": args.gpu,
        "replicas": args.replicas, "engine": attrs.asdict(shape),
        "peer_engine": peer_engine, "saturation_tokens": saturation,
        "fairness": args.fairness if fair else "off"},
        "capacity": capacity, "loads": {}}
    for load in args.load:
        scaled, rate_scale = offered(args, trace, load * capacity["capacity_rps"])
        results = {}
        for router_name, engine in systems:
            system = f"{router_name}@{engine}"
            router = make_router(router_name, names, block_size_tokens=block,
                                 index_capacity_blocks=shape.num_blocks * shape.block_size
                                 // block, saturation_tokens=saturation, seed=args.seed,
                                 fairness_weights=spec.fairness_weights,
                                 fairness_half_life_s=spec.fairness_half_life_s)
            with tqdm(total=len(scaled.requests), desc=f"x{load:g} {router_name}",
                      unit="req") as bar:
                run = run_cluster(scaled, router, system, replicas=names, engine=engine,
                                  shape=shape, cost_model=cost_model, progress=bar.update,
                                  slo=replica_slo if router_name in OURS else None,
                                  slos=judged.slos, build=judged.build)
            router.check_invariants()
            results[system] = slim(summarize(run, slos=judged.slos, weights=judged.weights),
                                   router)
        summary["loads"][f"{load:g}"] = {
            "load": load, "rate_scale": rate_scale,
            "offered_rps": len(scaled.requests) / max(scaled.duration_s, 1e-9),
            "systems": results,
            "goals": judge(results, goodput_goal=args.goodput_goal,
                           tenants=args.tenants != "none" or args.trace == BUSINESS_CASE)}
        print(f"\nload x{load:g} (scale {rate_scale:.2f}, "
              f"{summary['loads'][f'{load:g}']['offered_rps']:.2f} req/s offered)")
        print(format_table(list(results.values())))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {args.out / 'summary.json'}")
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_table(rows: list[dict]) -> str:
    """One line per system: goodput, admitted in SLO, TTFT p99, hit rate, Jain, rejections,
    retries placed, and replica rejections passed on while another replica had room."""
    header = (f"{'system':<66}{'goodput':>9}{'adm SLO%':>9}{'TTFT p99':>10}{'hit %':>7}"
              f"{'Jain':>7}{'rej':>6}{'retry':>6}{'room':>6}")
    lines = [header, "-" * len(header)]
    for r in rows:
        ttft = "-" if r["ttft_p99_s"] is None else f"{r['ttft_p99_s']:.2f}s"
        jain = "-" if r["jain"] is None else f"{r['jain']:.3f}"
        lines.append(f"{r['system']:<66}{r['goodput_rps'] or 0:>9.2f}"
                     f"{_pct(r['admitted_slo_attainment']):>9}{ttft:>10}"
                     f"{_pct(r['prefix_hit_rate']):>7}{jain:>7}{r['rejected']:>6}"
                     f"{r['router']['retries_placed']:>6}"
                     f"{r['router']['rejected_with_room']:>6}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
