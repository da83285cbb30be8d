"""``python -m benchmarks.ray_live``: SLO routing on Ray Serve, live, against the peers' routers.

Example (the measurement: 3 seeds, 30 s at 2x the cluster's measured capacity):

    python -m benchmarks.ray_live --seeds 0,1,2 --out out/ray_live

On a local 2-node Ray cluster (`LocalCluster`: a head and a second node, separate raylets on
127.0.0.1), one Serve app of 2 engine replicas (one a node) running the ``slo`` preset with
the live SLO benchmark's declaration (`benchmarks.live_slo.summary.DECLARATION`) and engine
shape (`LiveScale`), deployed once per router: ``slo`` (`SLORouter`), ``pow2`` (Ray Serve's
own) and ``session-sticky``. The live SLO benchmark's client (`benchmarks.live_slo.workload`:
chat, rag and unclassed requests of two teams, open-loop Poisson arrivals) streams from the
app's OpenAI ingress and judges every request (`run_metrics`).

Capacity comes first, on the ``pow2`` app (`benchmarks.live_slo.run.search_capacity`, as the
live SLO benchmark measures one server), or ``--capacity-rps`` is used. Each (seed, router) run then offers ``--load`` times it for
``--duration-s``; requests still open ``--drain-s`` after the last arrival are cancelled.
Beside the client's figures: the ingress's ``policies:router_rejected_with_room_total``
(replica rejections passed on while another replica had room; cluster routers only, None for
Ray's own ``pow2``) and ``policies:ingress_rejection_retries_total``. The goals are judged
per seed (`judge`). Writes ``OUT/summary.json`` and
``OUT/runs/<seed>/<router>/requests.jsonl``.

With ``--noisy-team`` one team sends three times the other's requests
(`NOISY_TEAM_SHARES`), as in the live SLO benchmark's noisy-team scenario; the declaration's
fairness weights reach our router and every replica, and the quiet team's admitted attainment
and share of goodput are judged too (`quiet_team_share`).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Mapping
from pathlib import Path

from benchmarks.e2e_business_cases.live import LiveScale, free_port
from benchmarks.e2e_business_cases.live_client import HttpReply
from benchmarks.live_slo.run import model_dir, play_run, search_capacity, write_requests
from benchmarks.live_slo.summary import (
    ATTAINMENT_MIN,
    DECLARATION,
    FAIR_SHARE_MIN,
    NOISY_TEAM_SHARES,
    quiet_team_share,
    run_metrics,
)
from benchmarks.live_slo.workload import build_requests, poisson_arrivals
from benchmarks.soak import metric_sums
from integrations.ray_serve import cluster as _cluster  # noqa: F401 - before Ray is imported

ROUTERS = ("slo", "pow2", "session-sticky")
APP = "ray-live"
COUNTERS = ("policies:router_rejected_with_room_total",
            "policies:ingress_rejection_retries_total")
OURS = "slo"


def plan(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The routers and seeds ``args`` name.

    Raises:
        SystemExit: naming the flag, for an unknown router, a seed that is not an integer,
            or a load or duration that is not positive.
    """
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = [r for r in routers if r not in ROUTERS]
    if not routers or unknown:
        raise SystemExit(f"--routers: unknown or none {unknown!r} (use {', '.join(ROUTERS)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds must be comma-separated integers, got {args.seeds!r}"
                         ) from None
    for flag in ("load", "duration_s"):
        if not getattr(args, flag) > 0:
            raise SystemExit(f"--{flag.replace('_', '-')} must be > 0, got "
                             f"{getattr(args, flag)!r}")
    return routers, seeds


def counter_deltas(router: str, before: Mapping[str, float], after: Mapping[str, float]
                   ) -> dict[str, float | None]:
    """Each of `COUNTERS` over one run; None for Ray's own ``pow2`` (it counts nothing)."""
    return {name: None if router == "pow2" else after[name] - before[name]
            for name in COUNTERS}


def judge(runs: Mapping[str, Mapping[str, Mapping]], *, noisy_team: bool = False) -> dict:
    """The live goals of `OURS` on each seed (``runs``: seed -> router -> run metrics), and
    on how many seeds each was met: admitted in SLO >= `ATTAINMENT_MIN`, goodput >= the
    best peer's, and no replica rejection passed on while another replica had room; with
    ``noisy_team``, also the quiet team's admitted attainment >= `ATTAINMENT_MIN` and its
    goodput >= `FAIR_SHARE_MIN` times its fair share."""
    goals = ("admitted_met", "goodput_met", "room_met",
             *(("quiet_admitted_met", "quiet_share_met") if noisy_team else ()))
    seeds = {}
    for seed, by_router in runs.items():
        ours = by_router.get(OURS)
        peers = {name: m for name, m in by_router.items() if name != OURS}
        if ours is None or not peers:
            continue
        best = max(peers, key=lambda name: peers[name]["goodput_rps"])
        room = ours.get(COUNTERS[0])
        seeds[seed] = {
            "best_peer": best,
            "goodput_ratio": (ours["goodput_rps"] / peers[best]["goodput_rps"]
                              if peers[best]["goodput_rps"] else None),
            "admitted_met": (ours["admitted_slo_attainment"] or 0.0) >= ATTAINMENT_MIN,
            "goodput_met": ours["goodput_rps"] >= peers[best]["goodput_rps"],
            "room_met": room == 0}
        if noisy_team:
            attainment, goodput, fair = quiet_team_share(ours)
            seeds[seed].update(quiet_admitted_attainment=attainment,
                               quiet_goodput_rps=goodput, quiet_fair_share_rps=fair,
                               quiet_admitted_met=(attainment or 0.0) >= ATTAINMENT_MIN,
                               quiet_share_met=goodput >= FAIR_SHARE_MIN * fair)
    return {"seeds": seeds, "met": {goal: sum(s[goal] for s in seeds.values())
                                    for goal in goals},
            "of": len(seeds)}


def deploy_router(router: str, model: str, scale: LiveScale) -> None:
    """Deploy the app with ``router``, replacing the earlier one (fresh engines)."""
    from integrations.ray_serve.app import ServeConfig, deploy
    from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
    from integrations.vllm_v1.serving.server import KV_SPACE_ENV, offline_env

    env = offline_env(scale.vllm_args())  # as the live SLO servers: offline, 1 GiB of KV
    deploy(ServeConfig(model=model, pipeline=slo_pipeline(SLOSpec.parse(DECLARATION)),
                       vllm_args=scale.vllm_args(), replicas=2, router=router, name=APP,
                       max_ongoing_requests=256, runtime_env={"env_vars": {
                           key: env[key] for key in (KV_SPACE_ENV, "HF_HUB_OFFLINE",
                                                     "TRANSFORMERS_OFFLINE", "PYTHONPATH")
                           if key in env}}))


def play_once(url: str, model: str, rate_rps: float, duration_s: float, seed: int, *,
              drain_s: float, prefix: str, tenant_shares: tuple[float, ...] | None = None
              ) -> tuple[list, list[HttpReply], list, list]:
    """Poisson arrivals at ``rate_rps`` for ``duration_s`` through the app's ingress (the
    teams sending ``tenant_shares`` of the requests; None: equally), played as the live SLO
    benchmark plays them (`play_run`); records, replies, requests and the stalls the client
    lived through (`StallWatch.stalls`)."""
    arrivals = poisson_arrivals(rate_rps, duration_s, random.Random(f"{seed}:{prefix}"))
    requests = build_requests(arrivals, seed=seed, prefix=prefix, tenant_shares=tenant_shares)
    records, replies, watch = play_run(url, model, requests, with_priority=False,
                                       drain_s=drain_s)
    return records, replies, requests, watch.stalls


def measure_capacity(url: str, model: str, step_s: float, drain_s: float) -> dict:
    """`search_capacity` through the app's ingress."""

    def probe(rate: float, index: int) -> dict:
        records, replies, _, stalls = play_once(url, model, rate, step_s, index,
                                                drain_s=drain_s, prefix=f"cap{index}-")
        return run_metrics(records, replies, window_s=step_s, stalls=stalls)

    return {**search_capacity(probe, lambda line: print(line, flush=True)), "step_s": step_s}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--load", type=float, default=2.0,
                        help="offered rate, in multiples of the measured capacity")
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--capacity-rps", type=float, default=None,
                        help="skip the capacity measurement and use this rate")
    parser.add_argument("--capacity-step-s", type=float, default=20.0)
    parser.add_argument("--cpus-per-node", type=float, default=4.0)
    parser.add_argument("--noisy-team", action="store_true",
                        help="one team sends three times the other's requests; judge the "
                             "quiet team's attainment and share too")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    from integrations.ray_serve.cluster import LocalCluster

    routers, seeds = plan(args)
    model, scale, started = model_dir(), LiveScale(), time.perf_counter()
    summary: dict = {"config": {**vars(args), "out": str(args.out), "model": model,
                                "slo_declaration": DECLARATION}, "runs": {}}
    with LocalCluster(nodes=2, cpus_per_node=args.cpus_per_node,
                      http_port=free_port()) as cluster:
        url = cluster.url
        capacity = {"capacity_rps": args.capacity_rps, "given": True}
        if args.capacity_rps is None:
            deploy_router("pow2", model, scale)
            capacity = measure_capacity(url, model, args.capacity_step_s, args.drain_s)
        summary["capacity"] = capacity
        rate = args.load * capacity["capacity_rps"]
        for router in routers:
            deploy_router(router, model, scale)
            for seed in seeds:
                before = metric_sums(url, COUNTERS)
                records, replies, requests, stalls = play_once(
                    url, model, rate, args.duration_s, seed, drain_s=args.drain_s,
                    prefix="live-",
                    tenant_shares=NOISY_TEAM_SHARES if args.noisy_team else None)
                after = metric_sums(url, COUNTERS)
                write_requests(args.out / "runs" / str(seed) / router / "requests.jsonl",
                               records, replies, requests)
                metrics = run_metrics(records, replies, window_s=args.duration_s,
                                      stalls=stalls)
                metrics.update(counter_deltas(router, before, after))
                summary["runs"].setdefault(str(seed), {})[router] = metrics
                print(f"seed {seed} {router}: {metrics['admitted']}/{metrics['offered']} "
                      f"admitted, attainment {metrics['admitted_slo_attainment']}, goodput "
                      f"{metrics['goodput_rps']:.2f} req/s, rejected with room "
                      f"{metrics[COUNTERS[0]]}", flush=True)
    summary["goals"] = judge(summary["runs"], noisy_team=args.noisy_team)
    print(f"goals met on seeds (of {summary['goals']['of']}): {summary['goals']['met']}")
    summary["wall_s"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {args.out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
