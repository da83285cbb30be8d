"""Scheduler overhead: ``PolicyScheduler.schedule()`` vs stock ``Scheduler.schedule()``.

Both schedulers hold the same state (R running requests decoding, W waiting),
advance in lockstep with the same fake model outputs, and their ``schedule()``
calls are timed interleaved in one process (alternating which goes first), so
machine noise hits both alike. ``--clock cpu`` times the thread's CPU time instead of
wall time: on a machine shared with other jobs it leaves out the time the process
waits for a core. Writes ``OUT/summary.json``:

    {"results": [{"pipeline", "running", "waiting", "ratio_median", "ratio_p99",
                  "stock_median_us", "pipeline_median_us", ...}]}

``--churn`` replaces the steady decode batch with one that turns over: every request has a
short answer (16 to 63 tokens), so some finish and waiting ones start at every step (each
finished request is replaced by a new one, so the queue keeps its length); prompts
open with one of `CHURN_PREFIXES` shared prefixes; and the cache holds only `CHURN_BLOCKS_PER_SEQ`
blocks per running sequence, so freed blocks are cached, hit and evicted all the time. The
eviction order then runs on every block vLLM frees, touches or takes, and since frees happen
in ``update_from_output``, each timed call is the whole step (``schedule()`` and
``update_from_output()``) for both schedulers.

Usage: ``python -m benchmarks.overhead --out DIR [--iterations N] [--clock wall|cpu] [--churn]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.presets import preset
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from integrations.vllm_v1.pipeline import Pipeline
from policies.percentile import percentile

PROMPT_TOKENS = 64
CHURN_PREFIXES = 16
"""``--churn``: prompts open with one of this many shared 48-token prefixes."""
CHURN_BLOCKS_PER_SEQ = 8
"""``--churn``: KV blocks per running sequence (a 64-token prompt and its answer take 5-8)."""
CHURN_TIMED_IDS = 10**6
"""``--churn``: requests added during the timed steps are numbered from here (past the
warm-up's), one per finished request, so the queue keeps its length."""


ADMIT_ALL_SLO = {"classes": {"any": {"ttft_s": 3600.0, "tpot_s": 60.0}},
                 "by_prompt_tokens": [[None, "any"]]}
"""An ``slo`` preset declaration no request misses, so that it admits a whole load and runs
every other part (ranking, ledger, step bound, step model): the overhead benchmark's state,
and the invariant suite's (its per-arrival admission cost is not in ``schedule()``)."""


def _pipeline(name: str | None) -> Pipeline | None:
    if name is None:
        return None
    return preset(name, TENANT_WEIGHTS, slo=ADMIT_ALL_SLO if name == "slo" else None)


def _churn_prompt(i: int) -> list[int]:
    prefix = [500_000 + (i % CHURN_PREFIXES) * 64 + j for j in range(48)]
    return prefix + [1_000_000 + i * 16 + j for j in range(16)]


def _churn_harness(pipeline_name: str | None, running: int, waiting: int) -> SchedulerHarness:
    shape = EngineShape(num_blocks=running * CHURN_BLOCKS_PER_SEQ + 64, max_num_seqs=running,
                        max_num_batched_tokens=8192, max_model_len=32768)
    harness = SchedulerHarness.build(_pipeline(pipeline_name), shape=shape)
    for i in range(running + waiting):
        _add_churn_request(harness, i)
    added = running + waiting
    for _ in range(64):  # into the steady state: requests finishing and starting every step
        for _ in harness.complete(harness.scheduler.schedule()).finished_request_ids:
            _add_churn_request(harness, added)
            added += 1
        harness.clock.advance(0.01)
    return harness


def _add_churn_request(harness: SchedulerHarness, i: int) -> None:
    harness.add_request(f"req-{i}", _churn_prompt(i), 16 + i % 48, priority=i % 5 - 2)
    harness.clock.advance(0.0001)


def _loaded_harness(pipeline_name: str | None, running: int, waiting: int) -> SchedulerHarness:
    shape = EngineShape(num_blocks=running * 64 + 64, max_num_seqs=running,
                        max_num_batched_tokens=8192, max_model_len=32768)
    harness = SchedulerHarness.build(_pipeline(pipeline_name), shape=shape)
    for i in range(running):
        prompt = [i * 7 + j for j in range(PROMPT_TOKENS)]
        harness.add_request(f"run-{i}", prompt, 30000, priority=i % 3)
        harness.clock.advance(0.001)
    while len(harness.scheduler.running) < running or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in harness.scheduler.running):
        harness.step()
        harness.clock.advance(0.01)  # rate limits refill with time
    for i in range(waiting):
        prompt = [100000 + i * 13 + j for j in range(PROMPT_TOKENS * (1 + i % 8))]
        harness.add_request(f"wait-{i}", prompt, 128, priority=i % 5 - 2)
        harness.clock.advance(0.0001)
    return harness


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure(pipeline_name: str, running: int, waiting: int, iterations: int,
            clock: str = "wall", churn: bool = False) -> dict:
    """Timed, interleaved ``schedule()`` calls of stock vLLM and one preset pipeline (with
    ``churn``, whole steps of a turning-over batch: see the module docstring)."""
    timer = CLOCKS[clock]
    build = _churn_harness if churn else _loaded_harness
    stock = build(None, running, waiting)
    ours = build(pipeline_name, running, waiting)
    timings: dict[str, list[float]] = {"stock": [], "pipeline": []}
    added = {"stock": CHURN_TIMED_IDS, "pipeline": CHURN_TIMED_IDS}
    for i in range(iterations):
        pair = [("stock", stock), ("pipeline", ours)]
        for name, harness in pair if i % 2 == 0 else reversed(pair):
            start = timer()
            output = harness.scheduler.schedule()
            if churn:
                step = harness.complete(output)
            timings[name].append(timer() - start)
            if churn:  # keep the queue as long as it was: one new request per finished one
                for _ in step.finished_request_ids:
                    _add_churn_request(harness, added[name])
                    added[name] += 1
            else:
                harness.complete(output)
            harness.clock.advance(0.01)
    stock_median = statistics.median(timings["stock"])
    ours_median = statistics.median(timings["pipeline"])
    return {
        "pipeline": pipeline_name,
        "running": running,
        "waiting": waiting,
        "iterations": iterations,
        "clock": clock,
        "churn": churn,
        "ratio_median": ours_median / stock_median,
        "ratio_p99": percentile(timings["pipeline"], 99) / percentile(timings["stock"], 99),
        "stock_median_us": stock_median * 1e6,
        "pipeline_median_us": ours_median * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="PolicyScheduler vs stock schedule() overhead")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--pipelines", default="identity,qos,default")
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--waiting", default="1000,10000")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the thread's CPU time (for a shared machine)")
    parser.add_argument("--churn", action="store_true",
                        help="a batch that turns over, with shared prefixes and a tight cache "
                             "(evictions every step); times whole steps")
    args = parser.parse_args(argv)
    configs = [(p, args.running, int(w)) for p in args.pipelines.split(",")
               for w in args.waiting.split(",")]
    results = [measure(*config, args.iterations, args.clock, args.churn)
               for config in tqdm(configs, desc="overhead")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"results": results}, indent=2))
    for r in results:
        print(f"{r['pipeline']:>10} running={r['running']} waiting={r['waiting']:>6}: "
              f"median {r['pipeline_median_us']:.0f} vs {r['stock_median_us']:.0f} us "
              f"(x{r['ratio_median']:.3f}), p99 x{r['ratio_p99']:.3f}")


if __name__ == "__main__":
    main()
