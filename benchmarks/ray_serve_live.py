"""Live Ray Serve run: our request router vs Ray Serve's default router, on the same requests.

On a local 2-node Ray cluster (`integrations.ray_serve.cluster.LocalCluster`), the same
app (2 vLLM replicas of the tiny random-weight model, one a node, behind the OpenAI
ingress) is deployed once with Ray Serve's default power-of-two-choices router
(``pow2``) and once with `PDRequestRouter` (``pd_router``, optionally with parameters),
and sent the same requests: ``--families`` prompt families (a ~300-token shared prefix
each, built from the MT-bench prompts embedded with the tiny tokenizer) in a seeded random
order, each with its own question, at most ``--concurrency`` in flight (bounded load).
Each replica's KV cache holds ``--kv-blocks`` blocks of 32 tokens: beside the blocks of
the requests it runs (at most ``--max-num-seqs`` at once, ~12 blocks each; the rest
queue, so balance matters too) about half of the families' prefixes fit, so where a
family's requests land decides whether its prefix is still cached.

With ``--parallel`` each `PDRequestRouter` setting is measured at the same time as a
``pow2`` copy of the app of its own (2 apps, 4 replicas, one round per setting): the
same requests reach both at once, and the machine's noise hits both alike.

Measured client-side: TTFT (first streamed event) p50/p99; from the replicas'
``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` (token-weighted,
deltas over the run): the prefix-cache hit rate; from the ingress: the routing
decisions. The tiny model on shared CPUs: relative numbers only. Writes
``OUT/ray_serve_live.json`` and, with ``--png``, the Grafana dashboard's panels rendered
from the last router's run's scrapes (each panel's own PromQL, evaluated by
`benchmarks.ray_serve_dashboard`).

Usage: ``python -m benchmarks.ray_serve_live --out DIR [--parallel] [--png PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
from pathlib import Path

import attrs

from integrations.ray_serve import cluster as _cluster  # noqa: F401 - before Ray is imported
from policies.percentile import percentile

ROUTERS = ("pow2", "pd_router")


def parse_router(spec: str) -> tuple[str, dict[str, float]]:
    """``pd_router:load_slack_tokens=0,balance_epsilon=0.2`` -> (router, its kwargs)."""
    name, _, rest = spec.partition(":")
    if name not in ROUTERS:
        raise ValueError(f"--routers: unknown router {name!r} (use {list(ROUTERS)})")
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = float(value) if "." in value else int(value)
    if kwargs and name != "pd_router":
        raise ValueError(f"--routers: {name} takes no parameters, got {spec!r}")
    return name, kwargs


def workload(families: int, requests: int, seed: int) -> list[tuple[int, str]]:
    """(family, prompt) pairs: each family a ~300-token prefix of MT-bench prompts, then a
    question of its own; families drawn uniformly in a seeded order."""
    import integrations.vllm_v1.instruments as instruments

    corpus = Path(instruments.__file__).parent / "tiny_model_data" / "corpus.jsonl"
    lines = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    prefixes = []
    for family in range(families):
        picked = rng.sample(lines, 6)
        prefixes.append(f"Conversation {family}. " + " ".join(picked)[:1100] + "\n")
    out = []
    for i in range(requests):
        family = rng.randrange(families)
        out.append((family, prefixes[family] + f"Question {i}: {rng.choice(lines)[:160]}"))
    return out


TENANTS = ("gold", "silver", "bronze")
"""Family ``f`` belongs to tenant ``TENANTS[f % 3]`` (labels the pipeline's metrics only)."""


async def _one(session, url: str, model: str, prompt: str, tenant: str
               ) -> tuple[float | None, str, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
            "stream": True, "vllm_xargs": {"tenant": tenant}}
    started = time.monotonic()
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        ttft = None
        async for line in answer.content:
            if line.startswith(b"data: ") and ttft is None:
                ttft = time.monotonic() - started
        return ttft, answer.headers.get("x-served-by", ""), answer.status


async def _drive(url: str, model: str, requests: list[tuple[int, str]], concurrency: int,
                 label: str, position: int = 0) -> list[dict]:
    import aiohttp
    from tqdm import tqdm

    limit = asyncio.Semaphore(concurrency)
    results: list[dict] = []
    progress = tqdm(total=len(requests), desc=label, unit="req", position=position)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def run(index: int, family: int, prompt: str) -> None:
            async with limit:
                ttft, replica, status = await _one(session, url, model, prompt,
                                                   TENANTS[family % len(TENANTS)])
            results.append({"index": index, "family": family, "ttft_s": ttft,
                            "replica": replica, "status": status})
            progress.update()

        await asyncio.gather(*(run(i, f, p) for i, (f, p) in enumerate(requests)))
    progress.close()
    return sorted(results, key=lambda r: r["index"])


def _engine_counters(targets: list[dict]) -> dict[str, dict[str, float]]:
    from benchmarks.ray_serve_dashboard import scrape

    out = {}
    for target in targets:
        samples = scrape(target["targets"][0])
        totals = {name: 0.0 for name in ("vllm:prefix_cache_hits_total",
                                         "vllm:prefix_cache_queries_total")}
        for name, _labels, value in samples:
            if name in totals:
                totals[name] += value
        out[target["labels"]["replica"]] = totals
    return out


class _Recorder(threading.Thread):
    """Scrapes the ingress and every engine replica each ``period_s`` into a `Series`."""

    def __init__(self, ingress: str, targets_dir: str, period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        from benchmarks.ray_serve_dashboard import Series

        self.series, self.ingress, self.targets_dir = Series(), ingress, targets_dir
        self.period_s, self.stop_event, self.started = period_s, threading.Event(), time.time()

    def run(self) -> None:
        from benchmarks.ray_serve_dashboard import scrape
        from integrations.ray_serve.metrics import TargetsDirectory

        while not self.stop_event.is_set():
            samples = []
            try:
                samples += scrape(f"{self.ingress}/metrics")
                for target in TargetsDirectory(self.targets_dir).targets():
                    samples += scrape(target["targets"][0], target["labels"])
            except OSError:
                pass
            self.series.add(time.time() - self.started, samples)
            self.stop_event.wait(self.period_s)


def _decisions(url: str) -> dict[str, float]:
    from urllib.request import urlopen

    from benchmarks.ray_serve_dashboard import parse_samples

    with urlopen(f"{url}/metrics", timeout=30) as page:
        return {dict(labels)["reason"]: value
                for name, labels, value in parse_samples(page.read().decode())
                if name == "policies:router_decisions_total"}


@attrs.define
class BenchApp:
    """One deployed copy of the app, with the router ``spec``."""

    spec: str
    name: str
    url: str
    targets_dir: str

    def targets(self) -> list[dict]:
        from integrations.ray_serve.metrics import TargetsDirectory

        return TargetsDirectory(self.targets_dir).targets()


def deploy_app(spec: str, *, model: str, cluster, kv_blocks: int, max_num_seqs: int,
               pipeline: str) -> BenchApp:
    """Deploy the app with router ``spec`` under ``/bench-<spec>`` (returns once it is up)."""
    from integrations.ray_serve.app import ServeConfig, deploy
    from integrations.ray_serve.demo import TINY_MODEL_ARGS

    router, router_kwargs = parse_router(spec)
    name = "bench-" + "".join(c if c.isalnum() else "-" for c in spec.lower())
    limits = ("--max-num-seqs", str(max_num_seqs)) if max_num_seqs else ()
    config = ServeConfig(model=model, pipeline=pipeline, replicas=2, router=router, name=name,
                         router_kwargs=router_kwargs,
                         vllm_args=(*TINY_MODEL_ARGS, "--num-gpu-blocks-override",
                                    str(kv_blocks), *limits))
    deploy(config, route_prefix=f"/{name}")
    return BenchApp(spec, name, f"{cluster.url}/{name}", str(config.targets().path))


def measure(apps: list[BenchApp], *, model: str, requests: list[tuple[int, str]],
            concurrency: int, record: BenchApp | None) -> dict[str, dict]:
    """Send ``requests`` to every app at once (each its own ``concurrency``), measure each."""
    targets = {app.spec: app.targets() for app in apps}

    async def warm_up() -> None:
        await asyncio.gather(*(_drive(app.url, model, [(0, "Warm up, please.")] * 2, 2,
                                      f"{app.spec} warm-up") for app in apps))

    asyncio.run(warm_up())
    before = {app.spec: (_engine_counters(targets[app.spec]), _decisions(app.url))
              for app in apps}
    recorder = _Recorder(record.url, record.targets_dir) if record is not None else None
    if recorder is not None:
        recorder.start()
    elapsed: dict[str, float] = {}

    async def run(app: BenchApp, position: int) -> list[dict]:
        started = time.monotonic()
        results = await _drive(app.url, model, requests, concurrency, app.spec, position)
        elapsed[app.spec] = time.monotonic() - started
        return results

    async def run_all() -> list[list[dict]]:
        return await asyncio.gather(*(run(app, i) for i, app in enumerate(apps)))

    all_results = asyncio.run(run_all())
    if recorder is not None:
        time.sleep(2 * recorder.period_s)
        recorder.stop_event.set()
        recorder.join()
    out = {}
    for app, results in zip(apps, all_results, strict=True):
        counters, decided = before[app.spec]
        decisions = {reason: value - decided.get(reason, 0.0)
                     for reason, value in _decisions(app.url).items()
                     if value > decided.get(reason, 0.0)}
        out[app.spec] = _summary(app.spec, results, counters,
                                 _engine_counters(targets[app.spec]), elapsed[app.spec],
                                 decisions, recorder.series if app is record else None)
    return out


def _summary(router, results, before, after, elapsed, decisions, series) -> dict:
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None and r["status"] == 200]
    hits = sum(after[r]["vllm:prefix_cache_hits_total"] - before[r]["vllm:prefix_cache_hits_total"]
               for r in after)
    queries = sum(after[r]["vllm:prefix_cache_queries_total"]
                  - before[r]["vllm:prefix_cache_queries_total"] for r in after)
    by_replica = {r: (after[r]["vllm:prefix_cache_hits_total"]
                      - before[r]["vllm:prefix_cache_hits_total"])
                  / max(1.0, after[r]["vllm:prefix_cache_queries_total"]
                        - before[r]["vllm:prefix_cache_queries_total"]) for r in after}
    families: dict[int, set[str]] = {}
    for r in results:
        families.setdefault(r["family"], set()).add(r["replica"])
    return {
        "router": router, "requests": len(results),
        "completed": sum(r["status"] == 200 for r in results),
        "ttft_p50_s": percentile(ttfts, 50) if ttfts else float("nan"),
        "ttft_p99_s": percentile(ttfts, 99) if ttfts else float("nan"),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_hit_rate_by_replica": by_replica,
        "requests_by_replica": {rep: sum(r["replica"] == rep for r in results)
                                for rep in sorted({r["replica"] for r in results})},
        "replicas_per_family_mean": statistics.fmean(len(v) for v in families.values()),
        "router_decisions": decisions, "elapsed_s": elapsed, "_series": series,
    }


def render_dashboard(series, path: Path, title: str) -> None:
    """Draw every panel of the Grafana dashboard from ``series`` (matplotlib, one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import ray_serve_dashboard as dashboard

    board = dashboard.load_dashboard()
    panels = board["panels"]
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(13, 3.6 * rows), squeeze=False)
    window_s = 5.0
    times = [t for t in series.times if t >= window_s]
    for axis, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            lines: dict[str, list[tuple[float, float]]] = {}
            for t in times:
                for labels, value in dashboard.evaluate(target["expr"], series, t,
                                                        window_s=window_s).items():
                    legend = target.get("legendFormat", "") or target["expr"]
                    for key, label in labels:
                        legend = legend.replace("{{" + key + "}}", label)
                    lines.setdefault(legend, []).append((t, value))
            for legend, points in sorted(lines.items()):
                axis.plot([p[0] for p in points], [p[1] for p in points], label=legend)
        axis.set_title(panel["title"], fontsize=10)
        axis.set_xlabel("s into the run", fontsize=8)
        axis.tick_params(labelsize=8)
        if axis.lines:
            axis.legend(fontsize=7, loc="best")
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _router_specs(text: str) -> list[str]:
    """Split ``--routers`` at commas that start a new router (parameters contain commas)."""
    specs: list[str] = []
    for part in filter(None, text.split(",")):
        if part.split(":")[0] in ROUTERS or not specs:
            specs.append(part)
        else:
            specs[-1] += "," + part
    for spec in specs:
        parse_router(spec)
    return specs


def _rounds(routers: list[str], parallel: bool) -> list[list[str]]:
    """The routers measured together: each alone, or (``parallel``) each `PDRequestRouter`
    setting beside a ``pow2`` app of its own (all at once when there is no ``pow2``)."""
    if not parallel:
        return [[spec] for spec in routers]
    ours = [spec for spec in routers if spec != "pow2"]
    if "pow2" not in routers or not ours:
        return [routers]
    return [["pow2", spec] for spec in ours]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--families", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kv-blocks", type=int, default=64,
                        help="KV blocks (32 tokens) per replica (64: 2 running requests' "
                             "~24 blocks plus about half of 8 families' ~76 prefix blocks)")
    parser.add_argument("--max-num-seqs", type=int, default=2,
                        help="requests a replica runs at once, the rest queue (0: vLLM's)")
    parser.add_argument("--pipeline", default="identity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--routers", default="pow2,pd_router,pd_router:load_slack_tokens=0",
                        help="pow2 and pd_router, the latter with PDRequestRouter arguments "
                             "after a colon (pd_router:load_slack_tokens=0,balance_epsilon=0.2)")
    parser.add_argument("--png", type=Path, default=None,
                        help="render the dashboard's panels from the pd_router run here")
    parser.add_argument("--parallel", action="store_true",
                        help="measure each pd_router setting at the same time as a pow2 app "
                             "of its own, on the same requests (the machine's noise hits both "
                             "alike; 4 engines at once)")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    from integrations.ray_serve.cluster import LocalCluster
    from integrations.vllm_v1.instruments import tiny_model_dir

    model = str(tiny_model_dir("random"))
    requests = workload(args.families, args.requests, args.seed)
    routers = _router_specs(args.routers)
    out: dict = {"config": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()}, "routers": {}}
    with LocalCluster(nodes=2, http_port=args.port) as cluster:
        out["cluster_startup_s"] = cluster.startup_s
        rounds = _rounds(routers, args.parallel)
        for specs in rounds:
            apps = [deploy_app(spec, model=model, cluster=cluster, kv_blocks=args.kv_blocks,
                               max_num_seqs=args.max_num_seqs, pipeline=args.pipeline)
                    for spec in specs]
            record = next((a for a in apps if a.spec == routers[-1]), None) if args.png else None
            try:
                results = measure(apps, model=model, requests=requests,
                                  concurrency=args.concurrency, record=record)
            finally:
                from ray import serve

                for app in apps:
                    serve.delete(app.name)
            ours = next((spec for spec in specs if spec != "pow2"), None)
            for spec, result in results.items():
                series = result.pop("_series")
                if series is not None:
                    render_dashboard(series, args.png, "llm-serving-policies on Ray Serve: "
                                     f"dashboard panels from a live run ({spec}, tiny model)")
                label = spec if spec != "pow2" or len(rounds) == 1 or len(specs) == 1 \
                    else f"pow2 (beside {ours})"
                out["routers"][label] = result
    out["vs_pow2"] = {}
    for label, mine in out["routers"].items():
        if label.startswith("pow2"):
            continue
        theirs = out["routers"].get(f"pow2 (beside {label})", out["routers"].get("pow2"))
        if theirs is not None:
            out["vs_pow2"][label] = {
                "ttft_p50_ratio": mine["ttft_p50_s"] / theirs["ttft_p50_s"],
                "ttft_p99_ratio": mine["ttft_p99_s"] / theirs["ttft_p99_s"],
                "hit_rate_delta": mine["prefix_cache_hit_rate"]
                - theirs["prefix_cache_hit_rate"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_serve_live.json").write_text(json.dumps(out, indent=2) + "\n")
    for router, result in out["routers"].items():
        print(f"{router:36} TTFT p50 {result['ttft_p50_s'] * 1000:7.1f} ms  p99 "
              f"{result['ttft_p99_s'] * 1000:7.1f} ms  prefix-cache hit rate "
              f"{result['prefix_cache_hit_rate']:.3f}  replicas/family "
              f"{result['replicas_per_family_mean']:.2f}  completed {result['completed']}"
              f"/{result['requests']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
