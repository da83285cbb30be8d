"""``python -m benchmarks.pd_replay.decision_latency``: `PDRouter.route` time vs instance count.

Half the instances prefill, half decode; the prefix index is warmed with the
first ``--warm`` requests of a trace, then each timed call routes the next
request under random loads. Every repeat makes the same calls, so each call's
time is its minimum over ``--repeats`` (as ``timeit`` takes the best: on a shared
machine the others measure the neighbours, a preempted call costing a whole
scheduler tick). Prints and returns the p50/p99 of those times in microseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from benchmarks.replay.workloads import load_workload
from policies.pd.router import InstanceLoad, PDRouter, chain_keys
from policies.percentile import percentile


def measure(num_instances: int, keys: list[list[int]], prompts: list[int], *, block_size: int,
            warm: int, seed: int = 0) -> np.ndarray:
    """Route ``keys[warm:]`` once each after routing ``keys[:warm]``; per-call times in µs."""
    rng = random.Random(seed)
    half = num_instances // 2
    router = PDRouter(prefill=[f"p{i}" for i in range(half)],
                      decode=[f"d{i}" for i in range(num_instances - half)],
                      block_size_tokens=block_size, rng=random.Random(seed))
    names = router.prefill + router.decode
    loads = {n: InstanceLoad(queued_prefill_tokens=rng.randrange(50_000),
                             running_decodes=rng.randrange(256), kv_usage=rng.random())
             for n in names}
    for i in range(warm):
        router.route(str(i), prompts[i], keys[i], loads)
    times = []
    for i in range(warm, len(keys)):
        started = time.perf_counter()
        router.route(str(i), prompts[i], keys[i], loads)
        times.append(time.perf_counter() - started)
    router.check_invariants()
    return np.asarray(times) * 1e6


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conv")
    parser.add_argument("--instances", default="4,16,64,256")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--warm", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    trace = load_workload(args.trace, max_requests=args.requests)
    keys = [chain_keys(r.block_hashes) for r in trace.requests]
    prompts = [r.prompt_tokens for r in trace.requests]
    rows = []
    for n in args.instances.split(","):
        micros = np.min([measure(int(n), keys, prompts, block_size=trace.block_size or 512,
                                 warm=args.warm) for _ in range(args.repeats)], axis=0)
        rows.append({"instances": int(n), "calls": len(micros),
                     "p50_us": percentile(micros, 50),
                     "p99_us": percentile(micros, 99)})
    print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
