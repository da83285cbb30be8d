"""Cache warming inside a real vLLM engine (tiny random-weight model, CPU): a restarted engine
warms the prefixes its predecessor learned, before traffic returns, and outputs do not change."""

import gc
import json
import time

import pytest

from integrations.vllm_v1 import Pipeline, build_llm
from policies.kv.cache_warming import PrefixWarmer
from tests.helpers.engine import ENGINE_KWARGS

pytestmark = pytest.mark.engine

BLOCK = ENGINE_KWARGS["block_size"]
SYSTEM = [(7 * i) % 3000 + 10 for i in range(4 * BLOCK)]
"""A tenant's four-block system prompt, as token ids."""


def prompt(n):
    return {"prompt_token_ids": SYSTEM + [(13 * n + j) % 3000 + 10 for j in range(20)]}


def first_request(llm, n):
    """Greedy tokens and prefix-cache hit tokens of one request with the shared prefix."""
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    (out,) = llm.generate([prompt(n)], SamplingParams(temperature=0, max_tokens=6),
                          use_tqdm=False)
    return list(out.outputs[0].token_ids), out.num_cached_tokens


@pytest.fixture(scope="module")
def runs(random_model_dir, tmp_path_factory):
    """Engine 1 serves three requests and shuts down; engine 2 starts from its hot set."""
    state = tmp_path_factory.mktemp("warming") / "hot_prefixes.json"
    pipeline = Pipeline(warming=PrefixWarmer(min_requests=2, max_kv_usage=1.0),
                        warming_state_path=str(state))
    kwargs = {**ENGINE_KWARGS, "model": random_model_dir, "enable_prefix_caching": True}
    llm = build_llm(pipeline, **kwargs)
    cold = first_request(llm, 0)
    for n in (1, 2):
        first_request(llm, n)
    del llm
    gc.collect()
    saved = json.loads(state.read_text())
    llm = build_llm(pipeline, **kwargs)
    time.sleep(3)  # the engine warms on its own, before any request
    warm = first_request(llm, 3)
    del llm
    gc.collect()
    return {"cold": cold, "warm": warm, "saved": saved}


def test_the_shutdown_saves_the_shared_prefix(runs):
    assert [record["tokens"] for record in runs["saved"]] == [SYSTEM]


def test_a_restarted_engine_hits_the_learned_prefix_on_its_first_request(runs):
    _, cold_hits = runs["cold"]
    _, warm_hits = runs["warm"]
    assert cold_hits == 0
    assert warm_hits == len(SYSTEM)
