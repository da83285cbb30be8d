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
  ``--max-rss-growth-mb`` from the end of the warm-up to the end, and no process was still
  growing over the last third of the run (`MemoryTrace`).

Memory over time (`MemoryTrace`): every ``--sample-s`` from start-up to the end, each
server process's ``VmRSS``, ``RssAnon`` and ``RssFile`` (``/proc/<pid>/status``) beside
vLLM's ``vllm:kv_cache_usage_perc`` and the tokens written into the KV cache so far
(``vllm:prompt_tokens_total`` + ``vllm:generation_tokens_total``). Growth cannot be KV pages
becoming resident once the whole KV cache has been written through, so each process's growth
after that point is reported apart. (On vLLM's CPU backend the KV cache is resident from
start-up anyway: the worker's anonymous memory at start-up was 573 MiB with a 128 MiB cache
and 1,469 MiB with 1,024 MiB.) Per process the report says ``flat``, ``levels off`` or
``still growing`` (over the last third of the run, in MiB per minute: a leak suspect).

Writes ``OUT/soak.json`` (``memory``: the samples and the per-process verdicts) and exits 1
if a check failed.

Usage: ``python -m benchmarks.soak --out DIR [--minutes 3] [--clients 6] [--model DIR]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
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
KV_CACHE_BYTES = 128 << 20
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
               "--block-size", "32", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES))
FLAT_MB = 16.0
"""Growth within this is noise (allocator arenas, caches of a few requests)."""


def accounting(outcomes: Counter) -> dict:
    """The run's request counts and whether offered = completed + rejected + cancelled +
    invalid with nothing unexpected."""
    counts = {outcome: outcomes.get(outcome, 0) for outcome in OUTCOMES}
    offered = sum(counts.values())
    balanced = counts["unexpected"] == 0 and offered == sum(
        counts[o] for o in ("completed", "rejected", "cancelled", "invalid"))
    return {"offered": offered, **counts, "balanced": balanced}


def metric_sums(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The server's /metrics ``names``, each summed over its labels (0 if absent)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def gauges(url: str) -> dict[str, float]:
    """`IDLE_GAUGES` from the server's /metrics, each summed over its labels."""
    return metric_sums(url, IDLE_GAUGES)


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


def process_memory_mb(pid: int) -> dict[str, float]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of ``pid`` from ``/proc/<pid>/status``, MiB."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in fields:
                values[fields[name]] = int(rest.split()[0]) / 1024  # kB
    return values


def server_memory_mb(pid: int) -> dict[str, dict[str, float]]:
    """`process_memory_mb` of the API server (``api_server``) and each descendant, by its
    process name (vLLM names its engine and worker processes), MiB."""
    root = psutil.Process(pid)
    memory = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            label = "api_server" if proc.pid == pid else f"{proc.name()}[{proc.pid}]"
            memory[label] = process_memory_mb(proc.pid)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    return memory


KV_METRICS = ("vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
              "vllm:generation_tokens_total")
"""KV usage now (a fraction) and the tokens written into the KV cache so far."""


def kv_tokens(url: str) -> int:
    """Tokens the KV cache holds when full: ``num_gpu_blocks`` x ``block_size`` of vLLM's
    ``vllm:cache_config_info``."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    raise ValueError("no vllm:cache_config_info in /metrics")


class MemoryTrace:
    """Samples the server's memory, KV cache usage and tokens written every ``every_s`` in a
    thread."""

    def __init__(self, url: str, pid: int, every_s: float) -> None:
        self.url, self.pid, self.every_s = url, pid, every_s
        self.samples: list[dict] = []
        self.phase = "idle"
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemoryTrace:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        """One sample: seconds since start-up, phase, KV usage, tokens written into the KV
        cache (prompt and generated), each process's memory."""
        try:
            values = metric_sums(self.url, KV_METRICS)
            usage, tokens = values[KV_METRICS[0]], values[KV_METRICS[1]] + values[KV_METRICS[2]]
        except OSError:
            usage = tokens = None
        self.samples.append({"t_s": round(time.monotonic() - self._started, 1),
                             "phase": self.phase, "kv_usage": usage, "kv_tokens_written": tokens,
                             "processes": server_memory_mb(self.pid)})

    def report(self, kv_cache_mb: float, kv_cache_tokens: int) -> dict:
        """Per process: RSS and anonymous memory at start-up, at the end of the warm-up, at
        the end and at most; anonymous growth since start-up, over the last third of the
        soak (MiB per minute) and since the KV cache was written through (``kv_cache_tokens``
        tokens written: no KV page can be new after it; None if it never was); the verdict
        (`verdict`)."""
        first, last = self.samples[0], self.samples[-1]
        measured = [s for s in self.samples if s["phase"] == "soak"] or self.samples
        tail = measured[len(measured) * 2 // 3:]
        full = next((s for s in self.samples
                     if (s["kv_tokens_written"] or 0) >= kv_cache_tokens), None)
        processes = {}
        for label in last["processes"]:
            series = [s["processes"][label] for s in self.samples if label in s["processes"]]
            start = first["processes"].get(label, series[0])
            warm = measured[0]["processes"].get(label, start)
            end = last["processes"][label]
            recent = [s for s in tail if label in s["processes"]]
            tail_growth = (recent[-1]["processes"][label]["anon"]
                           - recent[0]["processes"][label]["anon"]) if recent else 0.0
            minutes = (recent[-1]["t_s"] - recent[0]["t_s"]) / 60 if recent else 0.0
            growth = end["anon"] - start["anon"]
            after_full = (None if full is None or label not in full["processes"]
                          else round(end["anon"] - full["processes"][label]["anon"], 1))
            processes[label] = {
                "rss_mb": {"startup": round(start["rss"], 1), "warm": round(warm["rss"], 1),
                           "end": round(end["rss"], 1),
                           "max": round(max(m["rss"] for m in series), 1)},
                "anon_mb": {"startup": round(start["anon"], 1), "warm": round(warm["anon"], 1),
                            "end": round(end["anon"], 1)},
                "anon_growth_mb": round(growth, 1),
                "anon_growth_after_kv_full_mb": after_full,
                "tail_mb_per_min": round(tail_growth / minutes, 1) if minutes else 0.0,
                "verdict": verdict(growth, tail_growth),
            }
        usages = [s["kv_usage"] for s in self.samples if s["kv_usage"] is not None]
        return {"every_s": self.every_s, "kv_cache_mb": kv_cache_mb,
                "kv_full_at_s": None if full is None else full["t_s"],
                "kv_usage_max": max(usages, default=None), "processes": processes,
                "leak_suspects": sorted(label for label, p in processes.items()
                                        if p["verdict"] == "still growing"),
                "samples": self.samples}


def verdict(growth_mb: float, tail_growth_mb: float) -> str:
    """``flat`` (grew by at most `FLAT_MB` since start-up), ``levels off`` (grew, but not
    over the last third of the soak: a cache that filled, e.g. allocator arenas or buffers
    per batch shape) or ``still growing`` (more than `FLAT_MB` over the last third: a leak
    suspect)."""
    if tail_growth_mb > FLAT_MB:
        return "still growing"
    return "flat" if growth_mb <= FLAT_MB else "levels off"


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
    parser.add_argument("--sample-s", type=float, default=5.0,
                        help="seconds between memory samples")
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
        kv_cache_tokens = kv_tokens(server.url)
        with MemoryTrace(server.url, server.process.pid, args.sample_s) as trace:
            trace.phase = "warmup"
            warmup = run_load(args.port, model, args.warmup_s, args.clients, args.seed + 1000)
            wait_idle(server.url)
            rss_start = rss_mb(server.process.pid)
            trace.phase = "soak"
            started = time.monotonic()
            outcomes = run_load(args.port, model, args.minutes * 60, args.clients, args.seed)
            elapsed = time.monotonic() - started
            trace.phase = "idle"
            idle = wait_idle(server.url)
            rss_end = rss_mb(server.process.pid)
    counts = accounting(outcomes)
    kv_cache_mb = KV_CACHE_BYTES / (1 << 20)
    memory = trace.report(kv_cache_mb, kv_cache_tokens)
    result = {
        "minutes": args.minutes, "clients": args.clients, "elapsed_s": round(elapsed, 1),
        "requests": counts, "warmup_requests": accounting(warmup)["offered"],
        "idle_gauges": idle, "gauges_flat": not any(idle.values()),
        "rss_mb": {"start": round(rss_start, 1), "end": round(rss_end, 1),
                   "growth": round(rss_end - rss_start, 1),
                   "limit": args.max_rss_growth_mb},
        "rss_flat": rss_end - rss_start <= args.max_rss_growth_mb,
        "memory": memory,
        "server_log": str(log),
    }
    result["passed"] = (counts["balanced"] and result["gauges_flat"] and result["rss_flat"]
                        and not memory["leak_suspects"])
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "memory"}, indent=2))
    print(memory_table(memory))
    return 0 if result["passed"] else 1


def memory_table(memory: dict) -> str:
    """The per-process memory report as a text table."""
    full = memory["kv_full_at_s"]
    rows = [f"KV cache {memory['kv_cache_mb']:.0f} MiB, usage at most "
            f"{memory['kv_usage_max'] or 0:.1%}, written through "
            + ("never" if full is None else f"at {full:.0f} s"),
            f"{'process':28} {'rss start/warm/end/max MiB':>27} {'anon +MiB':>9} "
            f"{'after KV full':>13} {'MiB/min':>8}  verdict"]
    for label, p in memory["processes"].items():
        rss = "/".join(f"{p['rss_mb'][k]:.0f}" for k in ("startup", "warm", "end", "max"))
        after = p["anon_growth_after_kv_full_mb"]
        rows.append(f"{label:28} {rss:>27} {p['anon_growth_mb']:>9.1f} "
                    f"{'-' if after is None else f'{after:.1f}':>13} "
                    f"{p['tail_mb_per_min']:>8.1f}  {p['verdict']}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
