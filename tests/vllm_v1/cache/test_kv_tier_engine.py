"""The tiered KV connector inside a real vLLM engine (tiny random-weight model, CPU, a KV cache
small enough that requests are preempted and prefix blocks evicted from the GPU cache)."""

import pytest

from integrations.vllm_v1.cache.tiers.config import KVTierConfig, cpu_core_env
from tests.helpers.engine import ENGINE_KWARGS

pytestmark = pytest.mark.engine

PROMPTS = [f"Question {i}: " + "tell me about the history of rivers and mountains " * 6
           for i in range(8)]
PRESSURE = {**ENGINE_KWARGS, "max_model_len": 256, "num_gpu_blocks_override": 20,
            "max_num_seqs": 4, "enable_prefix_caching": True, "disable_log_stats": False}
"""20 blocks of 32 tokens for four running requests of 6 blocks each: vLLM preempts.
(``num_gpu_blocks_override``: ``VLLM_CPU_KVCACHE_SPACE``, set by conftest, overrides
``kv_cache_memory_bytes`` on CPU.)"""
TIERS = KVTierConfig(cpu_blocks=24, disk_blocks=256)
"""More blocks are saved than the CPU tier holds: some go to disk."""


def tier_metrics(llm):
    """``{name: value}`` of the connector's metrics (``name[tier]`` for per-tier ones)."""
    values = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:kv_tier_"):
            tier = metric.labels.get("tier")
            name = metric.name.removeprefix("vllm:kv_tier_") + (f"[{tier}]" if tier else "")
            values[name] = metric.value
    return values


def loaded_tokens(metrics):
    return sum(v for k, v in metrics.items() if k.startswith("loaded_tokens"))


def greedy(llm, prompts, salt=None):
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    inputs = [{"prompt": p, "cache_salt": salt} if salt else p for p in prompts]
    return [list(out.outputs[0].token_ids)
            for out in llm.generate(inputs, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def run(random_model_dir):
    """One tiered engine: a pressured batch, a reference pass, then a repeated prompt."""
    from integrations.vllm_v1.vllm_surface.names import LLM

    with pytest.MonkeyPatch.context() as env:
        for name, value in cpu_core_env().items():
            env.setenv(name, value)
        llm = LLM(**TIERS.engine_kwargs(**PRESSURE, model=random_model_dir))
    result = {"pressured": greedy(llm, PROMPTS)}
    result["after_pressure"] = tier_metrics(llm)
    # Reference: each prompt alone (no preemption) under a fresh cache salt (no tier holds
    # its blocks), so every token is computed: the engine as without tiering.
    result["reference"] = [greedy(llm, [p], salt="reference")[0] for p in PROMPTS]
    result["after_reference"] = tier_metrics(llm)
    result["repeat"] = greedy(llm, PROMPTS[:1])[0]
    result["after_repeat"] = tier_metrics(llm)
    del llm
    return result


def test_preempted_requests_resume_from_the_cpu_tier(run):
    metrics = run["after_pressure"]
    assert metrics["resumed_requests"] >= 1
    assert metrics["restored_tokens"] > metrics.get("recomputed_tokens", 0)
    assert loaded_tokens(metrics) >= metrics["restored_tokens"]


def test_greedy_outputs_are_token_identical_with_and_without_tiering(run):
    assert loaded_tokens(run["after_reference"]) == loaded_tokens(run["after_pressure"])
    assert len({tuple(tokens) for tokens in run["reference"]}) > 1, "outputs must depend on the prompt"
    assert run["pressured"] == run["reference"]


def test_blocks_overflow_to_disk_and_an_evicted_prompt_hits_a_tier(run):
    metrics = run["after_repeat"]
    assert metrics["blocks[cpu]"] == TIERS.cpu_blocks
    assert metrics["blocks[disk]"] > 0
    assert loaded_tokens(metrics) > loaded_tokens(run["after_reference"])
    assert run["repeat"] == run["reference"][0]
