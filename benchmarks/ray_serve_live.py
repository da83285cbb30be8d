"""Live Ray Serve run: our request router vs Ray Serve's default router, on the same requests.

On a local 2-node Ray cluster (`integrations.ray_serve.cluster.LocalCluster`), the same
app (2 vLLM replicas, one a node, behind the OpenAI ingress) is deployed with Ray
Serve's default power-of-two-choices router (``pow2``) and with `PDRequestRouter`
(``pd_router``, optionally with parameters), and sent the same requests
(`benchmarks.ray_serve_workload`): prompt families (a ~1.5k-token shared prefix each,
then a question of its own; at most ``--concurrency`` in flight) and agent sessions
(growing contexts with a ``session_id``, turns a tool time apart), 16 output tokens each.

The model is a dummy-weight Llama (``--load-format dummy``, built locally, 4 layers of
width 512) whose ~2k-token prefill costs far more than a decode step on a CPU (about
1.2 s against 18 ms on this machine's shared cores), so a prefix-cache hit saves real
time; a replica starts in about a minute. Each replica's KV cache holds ``--kv-blocks``
blocks of 32 tokens: the running requests plus about half of the families' and
sessions' prefixes, so where a request lands decides whether its prefix is still cached.

Each `PDRequestRouter` setting runs at the same time as a ``pow2`` copy of the app (2
apps, 4 replicas): the same requests reach both at once, and the machine's noise hits
both alike. ``--seeds 0,1,2`` repeats the round per seed (fresh apps, new requests).

Measured client-side: TTFT (first streamed event) p50/p99, overall and per kind; from
the replicas' ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``
(token-weighted, deltas over the run): the prefix-cache hit rate; from the ingress: the
routing decisions. Writes ``OUT/ray_serve_live.json`` and ``OUT/ray_serve_live.png``
(TTFT CDFs per seed) and, with ``--png``, the Grafana dashboard's panels rendered from
the last seed's ``pd_router`` run's scrapes (`benchmarks.ray_serve_dashboard`).

Usage: ``python -m benchmarks.ray_serve_live --out DIR [--seeds 0,1,2] [--png PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path

import attrs

from benchmarks.ray_serve_workload import Call, LiveWorkload, build_workload, corpus_tokens
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


TENANTS = ("gold", "silver", "bronze")
"""Request ``i`` belongs to tenant ``TENANTS[i % 3]`` (labels the pipeline's metrics only)."""
MODEL_SPEC = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=8, head_dim=64, intermediate_size=1536,
                  max_position_embeddings=4096)
"""The dummy-weight Llama's shape (`TinyModelSpec` fields)."""
OUTPUT_TOKENS = 16


def engine_args(kv_blocks: int, max_num_seqs: int) -> tuple[str, ...]:
    """``vllm serve`` flags of every replica (dummy weights, 4k context, 32-token blocks)."""
    limits = ("--max-num-seqs", str(max_num_seqs)) if max_num_seqs else ()
    return ("--load-format", "dummy", "--dtype", "float32", "--max-model-len", "4096",
            "--enforce-eager", "--block-size", "32", "--kv-cache-memory-bytes", str(256 << 20),
            "--num-gpu-blocks-override", str(kv_blocks), "--seed", "0", *limits)


async def _one(session, url: str, model: str, call: Call, tenant: str
               ) -> tuple[float | None, str, int]:
    xargs = {"tenant": tenant, **({"session_id": call.session_id} if call.session_id else {})}
    body = {"model": model, "prompt": list(call.prompt), "max_tokens": OUTPUT_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True, "vllm_xargs": xargs}
    started = time.monotonic()
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        ttft = None
        async for line in answer.content:
            if line.startswith(b"data: ") and ttft is None:
                ttft = time.monotonic() - started
        return ttft, answer.headers.get("x-served-by", ""), answer.status


async def _drive(url: str, model: str, work: LiveWorkload, concurrency: int,
                 label: str, position: int = 0) -> list[dict]:
    """Families ``concurrency`` at a time; every session on its own, a turn after the
    previous one's answer and its tool time. Returns one record per call, in order."""
    import aiohttp
    from tqdm import tqdm

    calls = work.calls()
    index = {id(call): i for i, call in enumerate(calls)}
    limit = asyncio.Semaphore(concurrency)
    results: list[dict] = []
    progress = tqdm(total=len(calls), desc=label, unit="req", position=position)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def send(call: Call) -> None:
            i = index[id(call)]
            ttft, replica, status = await _one(session, url, model, call,
                                               TENANTS[i % len(TENANTS)])
            results.append({"index": i, "kind": call.kind, "group": call.group,
                            "prompt_tokens": len(call.prompt), "ttft_s": ttft,
                            "replica": replica, "status": status})
            progress.update()

        async def family(call: Call) -> None:
            async with limit:
                await send(call)

        async def agent(turns: tuple[Call, ...]) -> None:
            for turn in turns:
                await asyncio.sleep(turn.tool_s)
                await send(turn)

        await asyncio.gather(*(family(c) for c in work.families),
                             *(agent(turns) for turns in work.sessions))
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

    router, router_kwargs = parse_router(spec)
    name = "bench-" + "".join(c if c.isalnum() else "-" for c in spec.lower())
    config = ServeConfig(model=model, pipeline=pipeline, replicas=2, router=router, name=name,
                         router_kwargs=router_kwargs,
                         vllm_args=engine_args(kv_blocks, max_num_seqs))
    deploy(config, route_prefix=f"/{name}")
    return BenchApp(spec, name, f"{cluster.url}/{name}", str(config.targets().path))


def measure(apps: list[BenchApp], *, model: str, work: LiveWorkload,
            concurrency: int, record: BenchApp | None) -> dict[str, dict]:
    """Send ``work`` to every app at once (each its own ``concurrency``), measure each."""
    targets = {app.spec: app.targets() for app in apps}
    warm = LiveWorkload(families=(Call(group="family-warm", prompt=tuple(range(3, 40))),) * 2,
                        sessions=())

    async def warm_up() -> None:
        await asyncio.gather(*(_drive(app.url, model, warm, 2, f"{app.spec} warm-up")
                               for app in apps))

    asyncio.run(warm_up())
    before = {app.spec: (_engine_counters(targets[app.spec]), _decisions(app.url))
              for app in apps}
    recorder = _Recorder(record.url, record.targets_dir) if record is not None else None
    if recorder is not None:
        recorder.start()
    elapsed: dict[str, float] = {}

    async def run(app: BenchApp, position: int) -> list[dict]:
        started = time.monotonic()
        results = await _drive(app.url, model, work, concurrency, app.spec, position)
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


def _ttft_summary(results: list[dict]) -> dict[str, float]:
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None and r["status"] == 200]
    if not ttfts:
        return {"ttft_p50_s": float("nan"), "ttft_p99_s": float("nan"),
                "ttft_mean_s": float("nan")}
    return {"ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "ttft_mean_s": statistics.fmean(ttfts)}


def _summary(router, results, before, after, elapsed, decisions, series) -> dict:
    hits = sum(after[r]["vllm:prefix_cache_hits_total"] - before[r]["vllm:prefix_cache_hits_total"]
               for r in after)
    queries = sum(after[r]["vllm:prefix_cache_queries_total"]
                  - before[r]["vllm:prefix_cache_queries_total"] for r in after)
    by_replica = {r: (after[r]["vllm:prefix_cache_hits_total"]
                      - before[r]["vllm:prefix_cache_hits_total"])
                  / max(1.0, after[r]["vllm:prefix_cache_queries_total"]
                        - before[r]["vllm:prefix_cache_queries_total"]) for r in after}
    groups: dict[str, set[str]] = {}
    for r in results:
        groups.setdefault(r["group"], set()).add(r["replica"])

    def replicas_per(kind: str) -> float:
        touched = [len(v) for g, v in groups.items() if g.startswith(kind)]
        return statistics.fmean(touched) if touched else float("nan")

    return {
        "router": router, "requests": len(results),
        "completed": sum(r["status"] == 200 for r in results),
        **_ttft_summary(results),
        "by_kind": {kind: _ttft_summary([r for r in results if r["kind"] == kind])
                    for kind in ("family", "session")},
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_hit_rate_by_replica": by_replica,
        "requests_by_replica": {rep: sum(r["replica"] == rep for r in results)
                                for rep in sorted({r["replica"] for r in results})},
        "replicas_per_family_mean": replicas_per("family"),
        "replicas_per_session_mean": replicas_per("session"),
        "router_decisions": decisions, "elapsed_s": elapsed, "results": results,
        "_series": series,
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


def _rounds(routers: list[str]) -> list[list[str]]:
    """The routers measured together: each `PDRequestRouter` setting beside a ``pow2`` app
    of its own (all at once when there is no ``pow2``)."""
    ours = [spec for spec in routers if spec != "pow2"]
    if "pow2" not in routers or not ours:
        return [routers]
    return [["pow2", spec] for spec in ours]


def _versus(routers: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each `PDRequestRouter` setting against the ``pow2`` app that ran beside it."""
    out = {}
    for label, mine in routers.items():
        theirs = routers.get(f"pow2 (beside {label})", routers.get("pow2"))
        if not label.startswith("pow2") and theirs is not None:
            out[label] = {"ttft_p50_ratio": mine["ttft_p50_s"] / theirs["ttft_p50_s"],
                          "ttft_p99_ratio": mine["ttft_p99_s"] / theirs["ttft_p99_s"],
                          "hit_rate_delta": mine["prefix_cache_hit_rate"]
                          - theirs["prefix_cache_hit_rate"]}
    return out


def plot_runs(seeds: dict[str, dict], path: Path) -> None:
    """TTFT CDFs of every router, one panel per seed, with p99 and hit rate in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(seeds), figsize=(5.2 * len(seeds), 4), squeeze=False)
    for axis, (seed, run) in zip(axes.flat, seeds.items(), strict=True):
        for label, result in run["routers"].items():
            ttfts = sorted(r["ttft_s"] for r in result["results"] if r["ttft_s"] is not None)
            axis.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))],
                      label=f"{label}: p99 {result['ttft_p99_s']:.2f} s, "
                            f"hit {result['prefix_cache_hit_rate']:.2f}")
        axis.set_xscale("log")
        axis.set_title(f"seed {seed}", fontsize=10)
        axis.set_xlabel("TTFT (s)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    figure.suptitle("Ray Serve, live: PDRequestRouter vs pow2 on the same requests "
                    "(prompt families + agent sessions, dummy-weight 4x512 Llama on CPU)",
                    fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0", help="comma-separated; one round per seed")
    parser.add_argument("--families", type=int, default=6)
    parser.add_argument("--requests", type=int, default=36, help="family requests per seed")
    parser.add_argument("--prefix-tokens", type=int, default=1792)
    parser.add_argument("--question-tokens", type=int, default=192)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4, help="family requests in flight")
    parser.add_argument("--kv-blocks", type=int, default=400,
                        help="KV blocks (32 tokens) per replica (400: 2 running ~2k-token "
                             "requests plus about half of the families' and sessions' prefixes)")
    parser.add_argument("--max-num-seqs", type=int, default=2,
                        help="requests a replica runs at once, the rest queue (0: vLLM's)")
    parser.add_argument("--pipeline", default="identity")
    parser.add_argument("--routers", default="pow2,pd_router",
                        help="pow2 and pd_router, the latter with PDRequestRouter arguments "
                             "after a colon (pd_router:load_slack_tokens=0,balance_epsilon=0.2)")
    parser.add_argument("--png", type=Path, default=None,
                        help="render the dashboard's panels from the last pd_router run here")
    parser.add_argument("--port", type=int, default=8000)
    return parser


def _run_seed(seed: int, args, *, cluster, model: str, tokens: list[int],
              routers: list[str], png: Path | None) -> dict:
    from ray import serve

    work = build_workload(tokens, seed=seed, families=args.families, requests=args.requests,
                          prefix_tokens=args.prefix_tokens, question_tokens=args.question_tokens,
                          sessions=args.sessions, turns=args.turns, system_tokens=256,
                          task_tokens=768, step_tokens=320, tool_s=(0.5, 2.0))
    rounds, results = _rounds(routers), {}
    for specs in rounds:
        apps, deploy_s = [], {}
        for spec in specs:  # one at a time: each returns once its replicas are up
            started = time.monotonic()
            apps.append(deploy_app(spec, model=model, cluster=cluster, kv_blocks=args.kv_blocks,
                                   max_num_seqs=args.max_num_seqs, pipeline=args.pipeline))
            deploy_s[spec] = time.monotonic() - started
        record = next((a for a in apps if a.spec == routers[-1]), None) if png else None
        try:
            measured = measure(apps, model=model, work=work, concurrency=args.concurrency,
                               record=record)
        finally:
            for app in apps:
                serve.delete(app.name)
        ours = next((spec for spec in specs if spec != "pow2"), None)
        for spec, result in measured.items():
            series = result.pop("_series")
            if series is not None:
                render_dashboard(series, png, "llm-serving-policies on Ray Serve: dashboard "
                                 f"panels from a live run ({spec}, seed {seed})")
            result["deploy_s"] = deploy_s[spec]
            solo = len(rounds) == 1 or len(specs) == 1
            results[spec if spec != "pow2" or solo else f"pow2 (beside {ours})"] = result
    return {"routers": results, "vs_pow2": _versus(results)}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from transformers import AutoTokenizer

    from integrations.ray_serve.cluster import LocalCluster
    from integrations.vllm_v1.instruments.tiny_model import TinyModelSpec, tiny_model_dir

    model = str(tiny_model_dir("dummy", spec=TinyModelSpec(**MODEL_SPEC)))
    tokens = corpus_tokens(AutoTokenizer.from_pretrained(model))
    routers = _router_specs(args.routers)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    out: dict = {"config": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()},
                 "model": MODEL_SPEC, "seeds": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    with LocalCluster(nodes=2, http_port=args.port) as cluster:
        out["cluster_startup_s"] = cluster.startup_s
        for seed in seeds:
            out["seeds"][str(seed)] = _run_seed(
                seed, args, cluster=cluster, model=model, tokens=tokens, routers=routers,
                png=args.png if seed == seeds[-1] else None)
            (args.out / "ray_serve_live.json").write_text(json.dumps(out, indent=2) + "\n")
    plot_runs(out["seeds"], args.out / "ray_serve_live.png")
    for seed, run in out["seeds"].items():
        for router, result in run["routers"].items():
            print(f"seed {seed} {router:24} TTFT p50 {result['ttft_p50_s'] * 1000:7.1f} ms  "
                  f"p99 {result['ttft_p99_s'] * 1000:7.1f} ms  hit rate "
                  f"{result['prefix_cache_hit_rate']:.3f}  replicas/family "
                  f"{result['replicas_per_family_mean']:.2f}  /session "
                  f"{result['replicas_per_session_mean']:.2f}  completed "
                  f"{result['completed']}/{result['requests']}")
        for router, versus in run["vs_pow2"].items():
            print(f"seed {seed} {router} vs pow2: TTFT p99 x{versus['ttft_p99_ratio']:.2f}, "
                  f"hit rate {versus['hit_rate_delta']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
