"""One live engine through the tier workload: per-step timings, per-request tokens, metrics.

Round 1 sends ``requests`` prompts at once into a KV cache too small for them all
(vLLM preempts); round 2 sends the first half again after the GPU cache has moved
on (their prefix blocks are evicted from the GPU; a tier may still hold them).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

ENGINE = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "block_size": 32,
          "seed": 0, "kv_cache_memory_bytes": 64 << 20, "num_gpu_blocks_override": 20,
          "max_num_seqs": 4,
          "enable_prefix_caching": True, "disable_log_stats": False}
"""20 blocks of 32 tokens: four running requests of ~6 blocks do not fit."""


def prompts(count: int) -> list[str]:
    return [f"Question {i}: " + "tell me about the history of rivers and mountains " * 6
            for i in range(count)]


def run_round(llm: Any, texts: list[str], max_tokens: int, tag: str) -> dict[str, Any]:
    """Step the engine until ``texts`` finish; TTFT and preemption recovery per request.

    A request *recovers* in the first step that gives it a token after at least one step
    that gave it none although it had started (it was preempted): that step's duration is
    its resume-to-next-token time (a recompute or a tier load happens in that step).
    """
    from integrations.vllm_v1.instruments import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, text in enumerate(texts):
        engine.add_request(f"{tag}-{i}", text, params)
    tokens: dict[str, list[int]] = {}
    first_token_s: dict[str, float] = {}
    stalled: set[str] = set()
    recoveries_s: list[float] = []
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        outputs = engine.step()
        step_end = time.perf_counter()
        progressed = set()
        for out in outputs:
            new = list(out.outputs[0].token_ids)
            if len(new) > len(tokens.get(out.request_id, [])):
                progressed.add(out.request_id)
                first_token_s.setdefault(out.request_id, step_end - start)
            tokens[out.request_id] = new
        recoveries_s += [step_end - step_start] * len(progressed & stalled)
        started = {r for r, t in tokens.items() if 0 < len(t) < max_tokens}
        stalled = (stalled | (started - progressed)) - progressed
    ordered = [tokens[f"{tag}-{i}"] for i in range(len(texts))]
    ttft = sorted(first_token_s.values())
    return {"tokens": ordered, "wall_s": time.perf_counter() - start,
            "ttft_p50_s": statistics.median(ttft), "ttft_max_s": ttft[-1],
            "recoveries": len(recoveries_s),
            "recovery_p50_s": statistics.median(recoveries_s) if recoveries_s else None,
            "recovery_max_s": max(recoveries_s) if recoveries_s else None}


def metrics(llm: Any) -> dict[str, float]:
    """vLLM's counters that tell where prompt tokens came from, plus the connector's."""
    wanted = ("vllm:num_preemptions", "vllm:prompt_tokens_cached_by_source",
              "vllm:prompt_tokens_by_source", "vllm:kv_tier_")
    values: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith(wanted) and hasattr(metric, "value"):
            label = metric.labels.get("source") or metric.labels.get("tier")
            values[metric.name + (f"[{label}]" if label else "")] = metric.value
    return values


def run_system(model: str, engine_kwargs: dict[str, Any], requests: int,
               max_tokens: int) -> dict[str, Any]:
    """Both rounds on one engine built with ``engine_kwargs``."""
    from integrations.vllm_v1.instruments import LLM

    llm = LLM(model=model, **engine_kwargs)
    texts = prompts(requests)
    pressured = run_round(llm, texts, max_tokens, "pressure")
    after_pressure = metrics(llm)
    repeated = run_round(llm, texts[: requests // 2], max_tokens, "repeat")
    result = {"pressure": pressured, "repeat": repeated, "metrics_after_pressure": after_pressure,
              "metrics": metrics(llm)}
    del llm
    return result
