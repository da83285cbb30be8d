"""The business case live: the same workload, scaled down, through a real CPU vLLM over HTTP.

`business_workload` builds the same seven-tenant, five-phase trace as the
replay study, with short phases (time scaled by ``phase_s / 60``) and a lower
base rate; `live_requests` turns each request into token ids of a scaled
length (the tenant's system prompt stays a shared, versioned prefix) for the
embedded tiny model. Each system gets its own OpenAI server in turn:

- ``fcfs``, ``priority``: stock vLLM (``--scheduling-policy``), no pipeline;
- ``stock+queue-caps:BASE[:reqs=N][:tokens=N]``: stock vLLM ``BASE`` with its own frontend
  admission (``--max-num-queued-reqs``, ``--max-num-queued-tokens``);
- ``pipeline``, ``pipeline+fixes``: `systems.PIPELINES` via `integrations.vllm_v1.serve`.

`live_client.play` streams every request at its arrival time and records it
client-side; `phase_metrics.run_phases` summarises each phase as in the replay
study, so `report` formats the result. It is a tiny CPU model sharing the
machine with the client: only the relative behaviour of the systems means
anything, not the absolute times.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from benchmarks.e2e_business_cases.live_client import (
    LiveRequest,
    StallWatch,
    client_priority,
    play,
)
from benchmarks.e2e_business_cases.phase_metrics import run_phases
from benchmarks.e2e_business_cases.report import console_table, markdown_report
from benchmarks.e2e_business_cases.slos import DEFINITIONS, PRIMARY
from benchmarks.e2e_business_cases.systems import PIPELINES
from benchmarks.e2e_business_cases.targets import evaluate
from benchmarks.e2e_business_cases.workload import (
    BASE_RATE_SCALE,
    BusinessWorkload,
    business_workload,
)
from benchmarks.replay.records import MaxTokens, SystemRun
from benchmarks.replay.step_model_convergence import plot as plot_step_model
from benchmarks.replay.systems import QUEUE_CAPS, QueueCaps
from integrations.vllm_v1.instruments.step_log import step_log_server_args
from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir
from integrations.vllm_v1.serving.server import API_SERVER_MODULE, LocalServer, offline_env, serve

LIVE_SYSTEMS = ("fcfs", "priority", "stock+queue-caps:priority:reqs=128", "pipeline+slo")
"""The systems a live run compares by default (one server each, one after the other): the
product ``slo`` preset beside stock vLLM, with the queue-caps setting the replay's sweep found
best for the business case."""
REFERENCE_PHASE_S = 60.0
"""The replay study's phase length: live durations are scaled by ``phase_s / 60``."""
VOCAB = (3, 4096)
"""Token ids the prompts draw from: the tiny model's vocabulary without ``<s>``, ``</s>``, pad."""


@attrs.frozen(kw_only=True)
class LiveScale:
    """How the business workload shrinks to fit a tiny CPU engine and a few minutes.

    Time: phases of ``phase_s`` seconds; deadlines scaled by ``phase_s / 60``; a client's
    cancellation kept in real seconds, as its SLO is (a coding client that gives up after
    0.2-2 s of waiting does so on any engine; scaled with the phases it gave up after
    20-200 ms, before any system's first token). Rate: base rates ``rate_scale`` times the enterprise
    tenants' (the replay uses `BASE_RATE_SCALE`). Lengths: prompts and outputs
    times ``token_scale`` (at least one token), outputs capped at ``max_output_tokens``,
    prompts capped to fit ``max_model_len``.
    """

    phase_s: float = attrs.field(default=12.0, validator=attrs.validators.gt(0))
    rate_scale: float = attrs.field(default=2 * BASE_RATE_SCALE,
                                    validator=attrs.validators.gt(0))
    """Twice the replay's base rate: the tiny engine is lightly loaded in the baseline and
    overloaded in phase 5, as the replay's engine is."""
    token_scale: float = attrs.field(default=1 / 8, validator=attrs.validators.gt(0))
    max_output_tokens: int = attrs.field(default=64, validator=attrs.validators.gt(0))
    max_model_len: int = attrs.field(default=2048, validator=attrs.validators.gt(0))
    max_num_seqs: int = attrs.field(default=8, validator=attrs.validators.gt(0))
    """Running slots of the live engine: few, so that the waiting queue's order matters."""
    max_num_batched_tokens: int = attrs.field(default=256, validator=attrs.validators.gt(0))
    """Tokens per step: a long prompt's prefill takes several steps, as on a real engine."""
    dtype: str = "float32"
    """Model dtype (``bfloat16`` on a GPU)."""
    enforce_eager: bool = True
    """No CUDA graphs (a CPU engine has none; a GPU run turns them on)."""

    def loaded(self, load: float) -> LiveScale:
        """This scale with every rate ``load`` times higher (``--live-load``)."""
        if not load > 0:
            raise ValueError(f"load must be > 0, got {load}")
        return attrs.evolve(self, rate_scale=self.rate_scale * load)

    @property
    def time_scale(self) -> float:
        """Live seconds per second of the replay study."""
        return self.phase_s / REFERENCE_PHASE_S

    def vllm_args(self) -> tuple[str, ...]:
        """Server flags shared by every system: dummy weights, this engine size, synchronous
        scheduling (so a step log times each step; every system runs the same way)."""
        return ("--load-format", "dummy", "--dtype", self.dtype,
                *(("--enforce-eager",) if self.enforce_eager else ()),
                "--no-async-scheduling", "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
                "--block-size", "32", "--seed", "0")


QUICK = LiveScale(phase_s=6.0)
"""``--live --quick``: 6 s phases (30 s of traffic per system; the default has 12 s)."""


def _tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*VOCAB) for _ in range(count)]


def live_requests(workload: BusinessWorkload, scale: LiveScale) -> list[LiveRequest]:
    """Each request of ``workload`` with a token-id prompt of its scaled length.

    The prompt opens with the request's system-prompt blocks, each hash giving
    the same ``block_size * token_scale`` tokens wherever it appears (so a
    tenant's requests share a cacheable prefix, and a prompt version switch
    changes it), then tokens drawn from the request id.
    """
    per_block = max(1, round(workload.trace.block_size * scale.token_scale))
    requests = []
    for request in workload.trace.requests:
        max_tokens = min(scale.max_output_tokens,
                         max(1, round(request.output_tokens * scale.token_scale)))
        length = min(max(1, round(request.prompt_tokens * scale.token_scale)),
                     scale.max_model_len - max_tokens)
        prefix = [t for h in request.block_hashes for t in _tokens(h, per_block)][:length]
        own = _tokens(zlib.crc32(request.request_id.encode()), length - len(prefix))
        requests.append(LiveRequest(
            request=request, prompt_token_ids=tuple(prefix + own), max_tokens=max_tokens,
            cancel_after_s=request.cancel_after_s,
            deadline_ms=None if request.deadline_s is None
            else request.deadline_s * scale.time_scale * 1000))
    return requests


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(system: str, scale: LiveScale, *, model: str, log_path: Path,
                 step_log: Path | None = None) -> LocalServer:
    """An OpenAI server on ``model`` for one system (stock: no pipeline at all).

    With ``step_log``, a pipeline system's engine also logs every step there (the input of
    the replay's cost-model calibration); stock systems cannot log steps.
    """
    port = free_port()
    if system in PIPELINES:
        pipeline = PIPELINES[system]()
        extra = () if step_log is None else step_log_server_args(pipeline, step_log)
        return serve(pipeline, model, port=port, vllm_args=(*scale.vllm_args(), *extra),
                     log_path=str(log_path))
    caps = QueueCaps.parse(system) if system.startswith(QUEUE_CAPS + ":") else None
    if caps is None and system not in ("fcfs", "priority"):
        raise ValueError(f"unknown system {system!r}: use one of fcfs, priority, "
                         f"{QUEUE_CAPS}:BASE[:reqs=N][:tokens=N], {', '.join(PIPELINES)}")
    admission = [] if caps is None else [
        *(["--max-num-queued-reqs", str(caps.max_num_queued_reqs)]
          if caps.max_num_queued_reqs is not None else []),
        *(["--max-num-queued-tokens", str(caps.max_num_queued_tokens)]
          if caps.max_num_queued_tokens is not None else [])]
    argv = [sys.executable, "-m", API_SERVER_MODULE, "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--scheduling-policy", caps.base if caps else system,
            *admission, *scale.vllm_args()]
    with open(log_path, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                   env=offline_env(), start_new_session=True)
    return LocalServer(process, f"http://127.0.0.1:{port}", log_path)


def served_model(server: LocalServer) -> str:
    """The model name the server answers to."""
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


WARM_UP_PROMPT = (5, 6, 7)
"""The prompt of the one request `_warm_up` sends before the timed ones (it is in step logs)."""


def _warm_up(server: LocalServer, model: str) -> None:
    """One small request, so that the first timed request does not pay for lazy setup."""
    body = json.dumps({"model": model, "prompt": list(WARM_UP_PROMPT), "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


STEP_MODEL_METRICS = ("policies:step_model_relative_error", "policies:step_model_observations")


def scrape_step_model(url: str) -> dict[str, float]:
    """The step model's gauges on ``url``'s ``/metrics`` (empty for a stock server)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(STEP_MODEL_METRICS):
            name, _, value = line.rpartition(" ")
            key = ("relative_error_p50" if 'quantile="0.5"' in name
                   else "relative_error_p99" if 'quantile="0.99"' in name else "observations")
            values[key] = float(value)
    return values


class _StepModelWatch:
    """Reads the step model's gauges every ``every_s`` while a system plays (a thread)."""

    def __init__(self, url: str, every_s: float = 1.0) -> None:
        self.points: list[dict] = []
        self._url, self._every_s = url, every_s
        self._stop = threading.Event()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _StepModelWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                values = scrape_step_model(self._url)
            except OSError:
                continue
            if values:
                self.points.append({"time_s": time.perf_counter() - self._started, **values})


def run_system(system: str, requests: Sequence[LiveRequest], scale: LiveScale, *,
               model: str, log_dir: Path, step_log: Path | None = None,
               max_tokens: MaxTokens = "output") -> tuple[SystemRun, dict]:
    """Start ``system``'s server, play ``requests`` through it, stop it; the run and timings
    (with, for a pipeline with a learned step model, its ``/metrics`` error over time).
    ``max_tokens``: what the clients send (`live_client.request_body`)."""
    started = time.perf_counter()
    with start_server(system, scale, model=model, log_path=log_dir / f"{system}.log",
                      step_log=step_log) as server:
        server.wait_until_healthy(timeout_s=600)
        model = served_model(server)
        _warm_up(server, model)
        ready_s = time.perf_counter() - started
        with _StepModelWatch(server.url) as watch, client_priority(), StallWatch() as stalls:
            records, samples = asyncio.run(play(
                server.url, model, requests, max_tokens=max_tokens,
                max_model_len=scale.max_model_len,
                with_priority=not system.startswith((QUEUE_CAPS + ":fcfs", "fcfs"))))
        played_s = time.perf_counter() - started - ready_s
    run = SystemRun(system=system, records=tuple(records), samples=tuple(samples),
                    preemptions=0, steps=0, makespan_s=max(
                        (r.finish_s for r in records if r.finish_s is not None), default=0.0),
                    busy_s=0.0, wall_s=played_s)
    timings = {"server_ready_s": ready_s, "played_s": played_s, "stall_s": stalls.stall_s,
               "stall_longest_s": stalls.longest_s}
    if watch.points:
        timings["step_model"] = watch.points
    return run, timings


def run_live_study(*, scale: LiveScale = LiveScale(), seed: int = 0,
                   systems: Sequence[str] = LIVE_SYSTEMS, phases: int | None = None,
                   log_dir: Path | None = None, model: str | None = None,
                   step_logs: Path | None = None, max_tokens: MaxTokens = "output",
                   progress: Callable[[str], None] | None = None) -> dict:
    """Play the scaled workload through each system's live server in turn; a study summary.
    ``max_tokens``: what the clients send (`live_client.request_body`).

    ``model`` defaults to the embedded tiny model; with ``step_logs`` (a directory) each
    pipeline system's steps are logged to ``step_logs/<system>.jsonl``.

    The summary has the replay study's shape (``config``, ``phases`` with a
    `phase_metrics.phase_metrics` per system, ``targets``) plus ``live``: the
    scale, and per system the server start-up and play times. ``phases`` keeps
    only the first so many phases' requests (all by default), for tiny runs.
    """
    workload = business_workload(seed=seed, phase_s=scale.phase_s, rate_scale=scale.rate_scale)
    if phases is not None:
        workload = attrs.evolve(workload, phases=workload.phases[:phases], trace=attrs.evolve(
            workload.trace, requests=tuple(r for r in workload.trace.requests
                                           if r.arrival_s < phases * scale.phase_s)))
    requests = live_requests(workload, scale)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="live-business-case-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if step_logs is not None:
        step_logs.mkdir(parents=True, exist_ok=True)
    model = model or str(tiny_model_dir("dummy"))
    per_system, timings = {}, {}
    for system in systems:
        if progress:
            progress(system)
        run, timings[system] = run_system(
            system, requests, scale, model=model, log_dir=log_dir,
            step_log=None if step_logs is None else step_logs / f"{system}.jsonl",
            max_tokens=max_tokens)
        per_system[system] = run_phases(run, workload, DEFINITIONS[PRIMARY], DEFINITIONS)
        timings[system]["records"] = _outcomes(run)
    summary = {
        "config": {"requests": len(requests), "phase_s": scale.phase_s, "seed": seed,
                   "switch_tenant": workload.switch_tenant, "switch_s": workload.switch_s,
                   "weights": workload.weights,
                   "slo_definition": PRIMARY,
                   "slos": {k: attrs.asdict(v) for k, v in DEFINITIONS[PRIMARY].items()},
                   "model": model},
        "live": {"scale": attrs.asdict(scale), "max_tokens_mode": max_tokens, "systems": timings,
                 "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
                 "max_tokens": sum(r.max_tokens for r in requests)},
        "phases": [{"name": phase.name, "start_s": i * scale.phase_s,
                    "end_s": (i + 1) * scale.phase_s,
                    "systems": {system: per_system[system][i] for system in systems}}
                   for i, phase in enumerate(workload.phases)],
    }
    summary["targets"] = evaluate(summary)
    return summary


def _outcomes(run: SystemRun) -> dict[str, int]:
    counts = {"offered": len(run.records)}
    for outcome in ("completed", "rejected", "cancelled"):
        counts[outcome] = sum(r.outcome == outcome for r in run.records)
    return counts


def write_live(summary: dict, out: Path) -> None:
    """``out/live_summary.json`` and ``out/live_report.md`` (the replay report's tables)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "live_summary.json").write_text(json.dumps(summary, indent=1))
    header = ("Live run: tiny CPU model over HTTP, client-side times; only the relative "
              "behaviour of the systems means anything.\n\n")
    (out / "live_report.md").write_text(header + markdown_report(summary) + "\n")
    for system, timings in summary["live"]["systems"].items():
        points = [p for p in timings.get("step_model", ()) if "relative_error_p50" in p]
        if points:
            plot_step_model(points, out / f"step_model_{system}.png",
                            f"online step model, live CPU engine ({system}), wall time")


def main_live(out: Path, *, quick: bool, seed: int, systems: Sequence[str],
              max_tokens: MaxTokens = "output", load: float = 1.0) -> dict:
    """The ``--live`` command: run, write, print the headline. ``load`` multiplies every
    tenant's rate (`LiveScale.loaded`)."""
    started = time.perf_counter()
    scale = (QUICK if quick else LiveScale()).loaded(load)
    summary = run_live_study(scale=scale, seed=seed, systems=systems,
                             log_dir=out / "logs", max_tokens=max_tokens,
                             progress=lambda s: print(f"live: {s} ...", flush=True))
    write_live(summary, out)
    print(console_table(summary))
    print(f"\nwrote live_summary.json, live_report.md to {out} "
          f"in {time.perf_counter() - started:.0f} s")
    return summary
