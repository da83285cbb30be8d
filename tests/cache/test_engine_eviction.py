"""SegmentedLRU inside a real vLLM engine (tiny random-weight model, CPU, a tight KV cache)."""

import gc

import pytest

from integrations.vllm_v1 import Pipeline
from policies import SegmentedLRU
from tests.conftest import ENGINE_KWARGS

pytestmark = pytest.mark.engine

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 6
PROMPTS = [SYSTEM + question for question in (
    "What is the capital of France?", "Write a haiku about rain.", "What is 17 times 3?",
    "Name three primes.", "Define entropy.", "Translate 'cat' to German.")]
TIGHT_KV = {**ENGINE_KWARGS, "kv_cache_memory_bytes": 40 * 64 * 1024}
"""About 40 blocks of 32 tokens: the prompts' blocks cannot all stay cached, so blocks are
evicted (and shared-prefix blocks hit) while generating."""


def greedy_twice(llm):
    """Greedy outputs of every prompt, generated twice (the second pass hits the prefix cache)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8)
    return [[list(out.outputs[0].token_ids)
             for out in llm.generate(PROMPTS, params, use_tqdm=False)] for _ in range(2)]


@pytest.fixture(scope="module")
def outputs(random_model_dir):
    """Stock vLLM and the SegmentedLRU pipeline, one engine at a time."""
    from vllm import LLM

    results = {}
    kwargs = {**TIGHT_KV, "model": random_model_dir, "enable_prefix_caching": True}
    for name, make in [("stock", lambda: LLM(**kwargs)),
                       ("slru", lambda: Pipeline(eviction=SegmentedLRU()).llm(**kwargs))]:
        llm = make()
        results[name] = greedy_twice(llm)
        del llm
        gc.collect()
    return results


def test_segmented_lru_gives_token_identical_greedy_outputs(outputs):
    stock = outputs["stock"]
    assert len({tuple(tokens) for tokens in stock[0]}) > 1, "outputs must depend on the prompt"
    assert stock[0] == stock[1]
    assert outputs["slru"] == stock
