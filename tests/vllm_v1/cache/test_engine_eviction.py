"""SegmentedLRU inside a real vLLM engine (tiny random-weight model, CPU, a tight KV cache)."""

import gc

import pytest

from integrations.vllm_v1 import Pipeline, build_llm
from policies import SegmentedLRU
from tests.helpers.engine import ENGINE_KWARGS

pytestmark = pytest.mark.engine

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 6
PROMPTS = [SYSTEM + f"Context for this question: {question} " * 4 + question for question in (
    "What is the capital of France?", "Write a haiku about rain.", "What is 17 times 3?",
    "Name three primes.", "Define entropy.", "Translate 'cat' to German.")]
"""160-210 tokens each: 3 full blocks of the shared system prompt, then 2-3 full blocks of
their own (16 distinct full prompt blocks in all)."""
KV_BLOCKS = 10
TIGHT_KV = {**ENGINE_KWARGS, "max_model_len": 256, "num_gpu_blocks_override": KV_BLOCKS,
            "disable_log_stats": False}
"""10 blocks of 32 tokens: the prompts' 16 full blocks cannot all stay cached, so blocks are
evicted (and shared-prefix blocks hit) while generating. (``num_gpu_blocks_override``:
``VLLM_CPU_KVCACHE_SPACE``, set by conftest, overrides ``kv_cache_memory_bytes`` on CPU.)"""


def engine_metrics(llm):
    """``{name: value}`` of the engine's counters, and its KV block count."""
    from vllm.v1.metrics.reader import Counter

    metrics = llm.get_metrics()
    values = {m.name: m.value for m in metrics if isinstance(m, Counter)}
    info = next(m for m in metrics if m.name == "vllm:cache_config_info")
    values["num_gpu_blocks"] = int(info.labels["num_gpu_blocks"])
    return values


def greedy_twice(llm):
    """Greedy outputs of every prompt, generated twice; the engine's KV blocks; the second
    pass's prefix-cache hit tokens and what it would hit if no block had been evicted."""
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8)
    outputs, hits = [], []
    for _ in range(2):
        outputs.append([list(out.outputs[0].token_ids)
                        for out in llm.generate(PROMPTS, params, use_tqdm=False)])
        hits.append(engine_metrics(llm)["vllm:prefix_cache_hits"])
    block_size = TIGHT_KV["block_size"]
    tokenizer = llm.get_tokenizer()
    full_block_tokens = sum(len(tokenizer(prompt).input_ids) // block_size * block_size
                            for prompt in PROMPTS)
    return outputs, engine_metrics(llm)["num_gpu_blocks"], hits[1] - hits[0], full_block_tokens


@pytest.fixture(scope="module")
def outputs(random_model_dir):
    """Stock vLLM and the SegmentedLRU pipeline, one engine at a time."""
    from integrations.vllm_v1.vllm_surface.names import LLM

    results = {}
    kwargs = {**TIGHT_KV, "model": random_model_dir, "enable_prefix_caching": True}
    for name, make in [("stock", lambda: LLM(**kwargs)),
                       ("slru", lambda: build_llm(Pipeline(eviction=SegmentedLRU()), **kwargs))]:
        llm = make()
        results[name] = greedy_twice(llm)
        del llm
        gc.collect()
    return results


def test_the_kv_cache_is_tight(outputs):
    for name, (_, num_blocks, second_pass_hits, full_block_tokens) in outputs.items():
        assert num_blocks == KV_BLOCKS, name
        assert 0 < second_pass_hits < full_block_tokens, name  # shared blocks hit, others evicted


def test_segmented_lru_gives_token_identical_greedy_outputs(outputs):
    stock = outputs["stock"][0]
    assert len({tuple(tokens) for tokens in stock[0]}) > 1, "outputs must depend on the prompt"
    assert stock[0] == stock[1]
    assert outputs["slru"][0] == stock
