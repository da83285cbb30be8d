"""The suffix-automaton proposer inside a real vLLM engine (tiny random-weight model, CPU)."""

import gc

import pytest

from tests.helpers.engine import ENGINE_KWARGS

pytestmark = pytest.mark.engine

PROPOSER = "integrations.vllm_v1.speculative.proposer.SuffixAutomatonProposer"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 1, 2, 3, 1, 2, 3,"]
FIRST_TOKENS = 64
REPLAYED_TOKENS = 16


def run(llm):
    """Greedy outputs of a batch, then of a request that repeats the first one's prompt + output.

    Greedy decoding is deterministic, so the second request's prompt (prompt 0 followed by the
    first `REPLAYED_TOKENS` tokens of its output) must continue exactly as output 0 did: a
    repetitive prompt whose continuation is in the proposer's shared cache.
    """
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    batch = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=FIRST_TOKENS),
                         use_tqdm=False)
    outputs = [list(out.outputs[0].token_ids) for out in batch]
    prompt = list(batch[0].prompt_token_ids) + outputs[0][:REPLAYED_TOKENS]
    (again,) = llm.generate([{"prompt_token_ids": prompt}],
                            SamplingParams(temperature=0,
                                           max_tokens=FIRST_TOKENS - REPLAYED_TOKENS),
                            use_tqdm=False)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode")}
    return outputs, list(again.outputs[0].token_ids), metrics


@pytest.fixture(scope="module")
def runs(random_model_dir):
    """Stock vLLM, then the same engine with the proposer; one engine at a time."""
    from integrations.vllm_v1.vllm_surface.names import LLM

    kwargs = {**ENGINE_KWARGS, "model": random_model_dir, "disable_log_stats": False}
    results = {}
    for name, extra in [("stock", {}),
                        ("suffix", {"speculative_config": {
                            "method": "custom_class", "model": PROPOSER,
                            "num_speculative_tokens": 8}})]:
        llm = LLM(**kwargs, **extra)
        results[name] = run(llm)
        del llm
        gc.collect()
    return results


def test_greedy_outputs_are_token_identical_with_the_proposer(runs):
    stock_batch, stock_again, _ = runs["stock"]
    suffix_batch, suffix_again, _ = runs["suffix"]
    assert len({tuple(o) for o in stock_batch}) == len(PROMPTS), "outputs depend on the prompt"
    assert suffix_batch == stock_batch
    assert suffix_again == stock_again


def test_repeated_prompt_continues_the_cached_output(runs):
    batch, again, _ = runs["stock"]
    assert again == batch[0][REPLAYED_TOKENS:]


def test_vllm_spec_decode_metrics_count_accepted_draft_tokens(runs):
    _, _, metrics = runs["suffix"]
    assert metrics["vllm:spec_decode_num_drafts"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
