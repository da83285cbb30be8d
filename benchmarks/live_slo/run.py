"""Run the live overload benchmark: servers one at a time, capacity first, then every scenario.

Each system is vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
on 127.0.0.1 with the same dummy-weight model and engine flags (`LiveScale.vllm_args`: KV
size, ``max_num_seqs``, tokens per step); only the policy flags differ:

- ``slo``: the ``slo`` preset (`summary.DECLARATION`), named in ``--additional-config`` as the
  README does, so the API server's door serves it too;
- ``fcfs``, ``priority``: stock ``--scheduling-policy``;
- ``stock+queue-caps:priority:reqs=N``: stock ``priority`` with vLLM's own frontend
  admission, ``N`` from the measured capacity times a queueing time (`QUEUE_WAIT_S`).

Capacity is measured first on a stock ``fcfs`` server (`search_capacity`): the open-loop
rate rises by `CAPACITY_STEP` until goodput stops rising, then bisections narrow it down;
capacity is the offered rate where it peaked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from benchmarks.e2e_business_cases.live import (
    LiveScale,
    _warm_up,
    free_port,
    served_model,
    start_server,
)
from benchmarks.e2e_business_cases.live_client import (
    HttpReply,
    LiveRequest,
    StallWatch,
    client_priority,
    play,
)
from benchmarks.live_slo.summary import (
    DECLARATION,
    SLO_SYSTEM,
    STALL_LIMIT_S,
    evaluate_goals,
    run_metrics,
)
from benchmarks.live_slo.workload import Scenario, build_requests, poisson_arrivals
from benchmarks.replay.systems import QUEUE_CAPS
from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir
from integrations.vllm_v1.serving.server import LocalServer, serve

STOCK = ("fcfs", "priority")
QUEUE_WAIT_S = (0.5, 1.0, 2.0)
"""Queue caps of the stock sweep: capacity x these seconds of queueing (the TTFT targets:
chat 0.5 s, rag 2 s)."""
CAPACITY_START_RPS = 2.0
CAPACITY_STEP = 1.5
CAPACITY_MAX_STEPS = 10
CAPACITY_DROP = 0.8
"""Stop raising the rate once goodput falls below this share of the peak."""
CAPACITY_REFINE = 2
"""Bisections between the peak rate and the next one probed (each narrows it by half)."""
CONTENTION_MAX_S = 900.0
"""The busy-loop child's own time limit, should the benchmark die without stopping it."""


def queue_cap_systems(capacity_rps: float, waits_s: Sequence[float] = QUEUE_WAIT_S
                      ) -> list[str]:
    """The stock queue-caps sweep: ``priority`` with at most capacity x wait queued requests."""
    depths = dict.fromkeys(max(1, round(capacity_rps * wait)) for wait in waits_s)
    return [f"{QUEUE_CAPS}:priority:reqs={depth}" for depth in depths]


def start_system(system: str, scale: LiveScale, *, model: str, log_path: Path) -> LocalServer:
    """The OpenAI server of one system (see the module docs)."""
    if system == SLO_SYSTEM:
        entry = {CONFIG_KEY: {"pipeline": "slo", "slo": DECLARATION}}  # as the README
        return serve(Pipeline(), model, port=free_port(), vllm_args=(
            *scale.vllm_args(), "--additional-config", json.dumps(entry)),
                     log_path=str(log_path))
    return start_server(system, scale, model=model, log_path=log_path)


class Contention:
    """A CPU-bound child process (a busy loop, bounded by `CONTENTION_MAX_S`) while open,
    stopped by its pid on exit. It runs in a session of its own, as another job on a shared
    node would: where the kernel groups CPU time by session (autogroup), a busy loop in the
    client's session would compete with the client, not with the server."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Contention:
        code = (f"import time\nend = time.monotonic() + {CONTENTION_MAX_S}\n"
                "while time.monotonic() < end:\n    pass\n")
        self.process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@attrs.frozen(kw_only=True)
class Settings:
    """What one benchmark invocation runs."""

    seeds: tuple[int, ...] = (0, 1, 2)
    scenarios: tuple[Scenario, ...]
    base_systems: tuple[str, ...] = (SLO_SYSTEM, *STOCK)
    queue_waits_s: tuple[float, ...] = QUEUE_WAIT_S
    capacity_step_s: float = 20.0
    drain_s: float = 60.0
    """Requests still open this long after the last arrival are cancelled (admitted, missed)."""
    server_per_run: bool = True
    """A fresh server for every run (seed, scenario, system, in that loop order); False: one
    server per seed and system, reused for every scenario."""
    capacity_rps: float | None = None
    """Skip the capacity measurement and use this."""
    stall_retries: int = 0
    """Play a run again (same arrivals, same server) while the client stood still longer
    than `STALL_LIMIT_S` in it, at most this many times; the last play is kept and the
    stalls of the ones dropped are recorded (``stall_s_dropped``)."""
    fresh_connections: bool = False
    """Each request on a connection of its own; False: connections kept alive and reused."""
    scale: LiveScale = LiveScale()


def model_dir() -> str:
    """The benchmark's model: the tiny dummy-weight Llama (`TinyModelSpec` defaults), the live
    business case's."""
    return str(tiny_model_dir("dummy"))


def _ready(server: LocalServer) -> str:
    server.wait_until_healthy(timeout_s=600)
    model = served_model(server)
    _warm_up(server, model)
    return model


def sends_priority(system: str) -> bool:
    """Whether the client sends each request's ``priority`` to ``system`` (not to ``fcfs``)."""
    return system != "fcfs" and not system.startswith(f"{QUEUE_CAPS}:fcfs")


def play_run(url: str, model: str, requests: list[LiveRequest], *, with_priority: bool,
             drain_s: float, fresh_connections: bool = False,
             ) -> tuple[list, list[HttpReply], StallWatch]:
    """Stream ``requests`` at their arrival times at the client's raised priority, over
    kept-alive connections (as an SDK's pool does) or one connection each
    (``fresh_connections``); records, replies and the stalls the client lived through."""
    replies = [HttpReply() for _ in requests]
    with client_priority(), StallWatch() as watch:
        records, _samples = asyncio.run(play(
            url, model, requests, with_priority=with_priority, drain_timeout_s=drain_s,
            replies=replies, fresh_connections=fresh_connections))
    return records, replies, watch


def write_requests(path: Path, records: Sequence, replies: Sequence[HttpReply],
                   requests: Sequence[LiveRequest]) -> None:
    """One JSON line per request: what was sent and what the client saw."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as sink:
        for record, reply, live in zip(records, replies, requests, strict=True):
            sink.write(json.dumps({
                "id": record.request_id, "tenant": record.tenant, "class": record.slo_class,
                "prompt_tokens": record.prompt_tokens, "max_tokens": live.max_tokens,
                "arrival_s": record.arrival_s, "send_lag_s": reply.send_lag_s,
                "first_token_s": record.token_times_s[0] if record.token_times_s else None,
                "finish_s": record.finish_s, "tokens": len(record.token_times_s),
                "ttft_s": record.ttft_s, "tpot_s": record.tpot_s, "outcome": record.outcome,
                "status": reply.status, "retry_after": reply.retry_after,
                "reason": record.reason, "body": reply.body}) + "\n")


def policy_metrics(server: LocalServer) -> str:
    """The server's ``policies:*`` series now (what the policies decided; empty for stock)."""
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
    except OSError as error:
        return f"# /metrics unreadable: {error}\n"
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("policies:"))


def search_capacity(probe: Callable[[float, int], dict],
                    progress: Callable[[str], None] = print) -> dict:
    """The open-loop rate where goodput peaks: ``probe(rate, index)`` plays one step and
    returns its `run_metrics`.

    The rate rises by `CAPACITY_STEP` until goodput stops rising (below `CAPACITY_DROP` of the
    peak, or two steps past it); then `CAPACITY_REFINE` bisections (geometric) between the
    peak and the next rate probed narrow it down. Capacity is the probed rate of the highest
    goodput."""
    steps: list[dict] = []

    def step(rate: float) -> dict:
        metrics = {"rate_rps": rate, **probe(rate, len(steps))}
        steps.append(metrics)
        progress(f"capacity {rate:.1f} req/s: goodput {metrics['goodput_rps']:.2f}")
        return metrics

    rate = CAPACITY_START_RPS
    for _ in range(CAPACITY_MAX_STEPS):
        step(rate)
        peak = max(steps, key=lambda s: s["goodput_rps"])
        if steps[-1]["goodput_rps"] < CAPACITY_DROP * peak["goodput_rps"] or (
                len(steps) >= 3 and peak is steps[-3]):
            break
        rate *= CAPACITY_STEP
    for _ in range(CAPACITY_REFINE):
        peak = max(steps, key=lambda s: s["goodput_rps"])
        above = [s["rate_rps"] for s in steps if s["rate_rps"] > peak["rate_rps"]]
        if not above:
            break
        step(math.sqrt(peak["rate_rps"] * min(above)))
    peak = max(steps, key=lambda s: s["goodput_rps"])
    return {"capacity_rps": peak["rate_rps"], "peak_goodput_rps": peak["goodput_rps"],
            "steps": steps}


def measure_capacity(settings: Settings, *, model: str, out: Path,
                     progress: Callable[[str], None]) -> dict:
    """`search_capacity` on a stock ``fcfs`` server."""
    with start_system("fcfs", settings.scale, model=model,
                      log_path=out / "logs" / "capacity_fcfs.log") as server:
        served = _ready(server)

        def probe(rate: float, index: int) -> dict:
            arrivals = poisson_arrivals(rate, settings.capacity_step_s, random.Random(index))
            requests = build_requests(arrivals, seed=index, prefix=f"cap{index}-")
            records, replies, watch = play_run(
                server.url, served, requests, with_priority=False, drain_s=settings.drain_s,
                fresh_connections=settings.fresh_connections)
            write_requests(out / "capacity" / f"step{index}" / "requests.jsonl", records,
                           replies, requests)
            return run_metrics(records, replies, window_s=settings.capacity_step_s,
                               stalls=watch.stalls)

        return {**search_capacity(probe, progress), "step_s": settings.capacity_step_s}


def run_order(seeds: Sequence[int], scenarios: Sequence[Scenario], systems: Sequence[str], *,
              server_per_run: bool) -> list[tuple[int, Scenario, str]]:
    """(seed, scenario, system) in the order they run: seed-major, then scenario, then system
    (systems interleaved); with one server per seed and system, system before scenario."""
    if server_per_run:
        return [(seed, scenario, system) for seed in seeds for scenario in scenarios
                for system in systems]
    return [(seed, scenario, system) for seed in seeds for system in systems
            for scenario in scenarios]


def run_benchmark(out: Path, settings: Settings, *, progress: Callable[[str], None],
                  on_run: Callable[[], None] = lambda: None) -> dict:
    """Measure capacity (unless given), run every (seed, scenario, system), write
    ``requests.jsonl`` per run under ``out/runs/`` and return the summary."""
    model = model_dir()
    started = time.perf_counter()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    capacity = ({"capacity_rps": settings.capacity_rps, "given": True}
                if settings.capacity_rps else measure_capacity(
                    settings, model=model, out=out, progress=progress))
    capacity_rps = capacity["capacity_rps"]
    systems = [*settings.base_systems,
               *queue_cap_systems(capacity_rps, settings.queue_waits_s)]
    runs: dict[str, dict[str, dict[str, dict]]] = {}
    server, current = None, None
    try:
        for seed, scenario, system in run_order(settings.seeds, settings.scenarios, systems,
                                                server_per_run=settings.server_per_run):
            key = (seed, scenario.name, system) if settings.server_per_run else (seed, system)
            if key != current:
                if server is not None:
                    server.stop()
                name = "_".join(str(k) for k in key).replace(":", "-").replace("=", "")
                server = start_system(system, settings.scale, model=model,
                                      log_path=out / "logs" / f"{name}.log")
                served, current = _ready(server), key
            rng = random.Random(f"{seed}:{scenario.name}")
            arrivals = scenario.arrivals(capacity_rps, rng)
            requests = build_requests(arrivals, seed=seed, prefix=f"{scenario.name}-",
                                      tenant_shares=scenario.tenant_shares)
            dropped = []
            while True:
                with Contention() if scenario.contention else contextlib.nullcontext():
                    records, replies, watch = play_run(
                        server.url, served, requests, with_priority=sends_priority(system),
                        drain_s=settings.drain_s, fresh_connections=settings.fresh_connections)
                if watch.stall_s <= STALL_LIMIT_S or len(dropped) >= settings.stall_retries:
                    break
                dropped.append(watch.stall_s)
                progress(f"seed {seed} {scenario.name} {system}: the client stood still "
                         f"{watch.stall_s:.1f} s; played again")
            run_dir = out / "runs" / scenario.name / f"seed{seed}" / system.replace(":", "_")
            write_requests(run_dir / "requests.jsonl", records, replies, requests)
            (run_dir / "policies_metrics.txt").write_text(policy_metrics(server))
            metrics = {**run_metrics(records, replies, window_s=scenario.window_s(arrivals),
                                     stalls=watch.stalls), "stall_s_dropped": dropped}
            runs.setdefault(scenario.name, {}).setdefault(str(seed), {})[system] = metrics
            progress(f"seed {seed} {scenario.name} {system}: "
                     f"{metrics['admitted']}/{metrics['offered']} admitted, attainment "
                     f"{_pct(metrics['admitted_slo_attainment'])}, goodput "
                     f"{metrics['goodput_rps']:.2f} req/s")
            on_run()
    finally:
        if server is not None:
            server.stop()
    scenarios = {s.name: attrs.asdict(s) for s in settings.scenarios}
    return {"config": {"seeds": list(settings.seeds), "systems": systems,
                       "scenarios": scenarios, "drain_s": settings.drain_s,
                       "server_per_run": settings.server_per_run,
                       "stall_retries": settings.stall_retries,
                       "fresh_connections": settings.fresh_connections,
                       "scale": attrs.asdict(settings.scale), "model": model,
                       "slo_declaration": DECLARATION},
            "capacity": capacity, "runs": runs,
            "goals": evaluate_goals(runs, scenarios),
            "wall_s": time.perf_counter() - started}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"
