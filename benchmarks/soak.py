"""Soak: a live server under mixed streams, cancels and rejections for ``--minutes``; nothing leaks.

One vLLM OpenAI server (the tiny random-weight model on CPU, or ``--model``) runs a
pipeline with a `QueueDepthLimit`, so a burst is partly rejected (503 ``queue_full``).
``--clients`` threads each loop until the time is up over a fixed mix: a stream read to
its end, a non-streaming request, a stream the client closes after its first token
(cancelled), and one request with bad metadata (400). At the end, once the engine is
idle, the run checks that

* every request is accounted for: offered = completed + rejected + cancelled + invalid,
  with no other outcome (``unexpected`` is 0);
* every queue gauge is back at 0 (`IDLE_GAUGES`: vLLM's running/waiting, the pipeline's
  per-tenant waiting/running);
* the server's resident memory (API server, engine and workers) grew by no more than
  ``--max-rss-growth-mb`` from the end of the warm-up to the end.

Writes ``OUT/soak.json`` and exits 1 if a check failed.

Usage: ``python -m benchmarks.soak --out DIR [--minutes 3] [--clients 6] [--model DIR]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil

from integrations.vllm_v1 import Pipeline, serve
from policies import QoSRanker, QueueDepthLimit

IDLE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "policies:waiting_requests", "policies:running_requests")
"""Gauges that must read 0 (summed over their labels) once the engine is idle."""
KINDS = ("stream", "whole", "cancel", "invalid")
OUTCOMES = ("completed", "rejected", "cancelled", "invalid", "unexpected")
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", str(128 << 20))


def accounting(outcomes: Counter) -> dict:
    """The run's request counts and whether offered = completed + rejected + cancelled +
    invalid with nothing unexpected."""
    counts = {outcome: outcomes.get(outcome, 0) for outcome in OUTCOMES}
    offered = sum(counts.values())
    balanced = counts["unexpected"] == 0 and offered == sum(
        counts[o] for o in ("completed", "rejected", "cancelled", "invalid"))
    return {"offered": offered, **counts, "balanced": balanced}


def gauges(url: str) -> dict[str, float]:
    """`IDLE_GAUGES` from the server's /metrics, each summed over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = dict.fromkeys(IDLE_GAUGES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, MiB."""
    process = psutil.Process(pid)
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / (1 << 20)


def one_request(port: int, model: str, kind: str, rng: random.Random) -> str:
    """Send one request of ``kind``; its outcome (one of `OUTCOMES`)."""
    body = {"model": model, "prompt": f"Tell me about {rng.randrange(10_000)}",
            "max_tokens": rng.randint(4, 48), "ignore_eos": True,
            "stream": kind in ("stream", "cancel"),
            "vllm_xargs": {"tenant": rng.choice(["gold", "bronze"])}}
    if kind == "invalid":
        body["vllm_xargs"]["deadline_ms"] = -1
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body),
                           {"content-type": "application/json"})
        response = connection.getresponse()
        if response.status == 400:
            return "invalid" if kind == "invalid" else "unexpected"
        if response.status in (429, 503):
            return "rejected"
        if response.status != 200 or kind == "invalid":
            return "unexpected"
        if kind == "cancel":
            response.readline()
            return "cancelled"  # the connection closes below, mid-stream
        text = response.read().decode()
        finished = '"finish_reason":"length"' in text.replace(" ", "")
        return "completed" if finished else "unexpected"
    except (OSError, http.client.HTTPException):
        return "unexpected"
    finally:
        connection.close()


def load(port: int, model: str, until: float, seed: int, outcomes: Counter,
         lock: threading.Lock) -> None:
    """One client: requests of every kind, in a seeded order, until ``until``."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        outcome = one_request(port, model, rng.choice(KINDS), rng)
        with lock:
            outcomes[outcome] += 1


def run_load(port: int, model: str, seconds: float, clients: int, seed: int) -> Counter:
    outcomes: Counter = Counter()
    lock = threading.Lock()
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=load, args=(port, model, until, seed + i, outcomes,
                                                   lock)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def wait_idle(url: str, timeout_s: float = 120.0) -> dict[str, float]:
    """The gauges once the engine is idle (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = gauges(url)
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--model", help="model directory (default: the tiny random model)")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model
    if model_dir is None:
        from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

        model_dir = str(tiny_model_dir("random"))
    pipeline = Pipeline(ranking=QoSRanker(), admission=QueueDepthLimit(max_waiting=4))
    log = Path(tempfile.mkdtemp(prefix="soak-")) / "server.log"
    with serve(pipeline, model_dir, port=args.port, vllm_args=SERVER_ARGS,
               log_path=str(log)) as server:
        server.wait_until_healthy(timeout_s=600)
        model = json.load(urllib.request.urlopen(server.url + "/v1/models"))["data"][0]["id"]
        warmup = run_load(args.port, model, args.warmup_s, args.clients, args.seed + 1000)
        wait_idle(server.url)
        rss_start = rss_mb(server.process.pid)
        started = time.monotonic()
        outcomes = run_load(args.port, model, args.minutes * 60, args.clients, args.seed)
        elapsed = time.monotonic() - started
        idle = wait_idle(server.url)
        rss_end = rss_mb(server.process.pid)
    counts = accounting(outcomes)
    result = {
        "minutes": args.minutes, "clients": args.clients, "elapsed_s": round(elapsed, 1),
        "requests": counts, "warmup_requests": accounting(warmup)["offered"],
        "idle_gauges": idle, "gauges_flat": not any(idle.values()),
        "rss_mb": {"start": round(rss_start, 1), "end": round(rss_end, 1),
                   "growth": round(rss_end - rss_start, 1),
                   "limit": args.max_rss_growth_mb},
        "rss_flat": rss_end - rss_start <= args.max_rss_growth_mb,
        "server_log": str(log),
    }
    result["passed"] = counts["balanced"] and result["gauges_flat"] and result["rss_flat"]
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
