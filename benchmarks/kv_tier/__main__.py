"""``python -m benchmarks.kv_tier``: preemption recovery and tier hits, stock vLLM vs tiers.

Example:

    python -m benchmarks.kv_tier --requests 12 --max-tokens 96 --out out/kv_tier

Runs the same workload (`benchmarks.kv_tier.live`) through a live CPU engine (tiny
random-weight model) twice in one process: stock vLLM, then with `KVTierConnector`.
Writes ``OUT/summary.json``: per system, round 1 (pressure: preemptions) and round 2
(repeat: prompts evicted from the GPU cache) TTFT and resume-to-next-token times,
preemptions, restored vs recomputed tokens, prompt tokens by source tier, and
whether greedy outputs were identical. Heavy imports happen inside ``main`` (vLLM
spawns processes that re-import this module).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--cpu-blocks", type=int, default=64)
    parser.add_argument("--disk-blocks", type=int, default=256)
    parser.add_argument("--systems", default="stock,tiered",
                        help="comma-separated run order of 'stock' and 'tiered'")
    parser.add_argument("--connector-core", action="store_true",
                        help="let vLLM reserve its extra CPU core for the connector (its "
                             "default; see kv_tier_config.cpu_core_env)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from benchmarks.kv_tier.live import ENGINE, run_system
    from integrations.vllm_v1.cache.tiers.config import KVTierConfig, cpu_core_env
    from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

    if not args.connector_core:
        os.environ.update(cpu_core_env())  # stock's core layout for both systems

    model = str(tiny_model_dir("random"))
    tiers = KVTierConfig(cpu_blocks=args.cpu_blocks, disk_blocks=args.disk_blocks)
    systems = {"stock": ENGINE, "tiered": tiers.engine_kwargs(**ENGINE)}
    order = args.systems.split(",")
    if sorted(order) != sorted(systems):
        parser.error(f"--systems must name each of {sorted(systems)} once")
    results = {name: run_system(model, systems[name], args.requests, args.max_tokens)
               for name in order}
    summary = {
        "workload": {"requests": args.requests, "max_tokens": args.max_tokens, "order": order,
                     "engine": ENGINE, "tiers": tiers.extra_config(),
                     "connector_core": args.connector_core},
        "outputs_identical": all(
            results["stock"][r]["tokens"] == results["tiered"][r]["tokens"]
            for r in ("pressure", "repeat")),
        "systems": {name: {**{r: {k: v for k, v in result[r].items() if k != "tokens"}
                              for r in ("pressure", "repeat")},
                           "metrics_after_pressure": result["metrics_after_pressure"],
                           "metrics": result["metrics"]}
                    for name, result in results.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
