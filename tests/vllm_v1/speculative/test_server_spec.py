"""Speculation over HTTP on a real CPU engine: the proposer's `policies:spec_*` metrics agree
with vLLM's own spec-decode counters on /metrics, and the pipeline's `SpeculationBudget` withholds
a class's drafts inside the engine without changing its output."""

import json
import time
from types import SimpleNamespace

import pytest

from integrations.vllm_v1 import Pipeline, engine_kwargs, serve
from policies.speculative import SpeculationBudget
from tests.helpers.http import free_port, get_text, metric, post, server_model

pytestmark = pytest.mark.engine

PROPOSER = "integrations.vllm_v1.speculative.proposer.SuffixAutomatonProposer"
PROMPT = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
FIRST_TOKENS = 48
REPLAYED_TOKENS = 16


@pytest.fixture(scope="module")
def server(random_model_dir, tmp_path_factory):
    budget = SpeculationBudget(default_max_draft_tokens=8)
    budget.set_limit("bronze", 0)
    pipeline = Pipeline(speculation=budget)
    config = engine_kwargs(pipeline, async_scheduling=False)["additional_config"]
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}
    args = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20),
            "--no-async-scheduling", "--speculative-config", json.dumps(spec),
            "--additional-config", json.dumps(config))
    folder = tmp_path_factory.mktemp("spec_server")
    with serve(pipeline, random_model_dir, port=free_port(), vllm_args=args,
               log_path=str(folder / "server.log")) as handle:
        handle.wait_until_healthy(timeout_s=400)
        yield SimpleNamespace(url=handle.url)


def generate(server, prompt, max_tokens, slo_class):
    status, body = post(server, "/v1/completions", {
        "model": server_model(server), "prompt": prompt, "temperature": 0,
        "max_tokens": max_tokens, "ignore_eos": True, "return_token_ids": True,
        "vllm_xargs": {"slo_class": slo_class}})
    assert status == 200, body
    choice = body["choices"][0]
    return body.get("prompt_token_ids") or choice["prompt_token_ids"], choice["token_ids"]


def spec_counters(server):
    text = get_text(server, "/metrics")
    return {name: metric(text, name) for name in (
        "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
        "policies:spec_accepted_tokens_total", "policies:spec_steps_total")} | {
        "withheld_bronze": metric(text, "policies:spec_draft_tokens_withheld_total",
                                  slo_class="bronze")}


def settled_counters(server, timeout_s=60.0):
    """The counters once vLLM's (recorded asynchronously by the API process) have caught up
    with the engine's: two equal consecutive readings in which vLLM's accepted tokens equal
    ours (a loaded machine can give two equal stale readings); the last reading after
    ``timeout_s``."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        counters = spec_counters(server)
        if counters == last and (counters["vllm:spec_decode_num_accepted_tokens_total"]
                                 == counters["policies:spec_accepted_tokens_total"]):
            return counters
        last = counters
        time.sleep(0.5)
    return last


def test_metrics_agree_and_the_budget_withholds_bronze_drafts(server):
    prompt_ids, output = generate(server, PROMPT, FIRST_TOKENS, "gold")
    replay = prompt_ids + output[:REPLAYED_TOKENS]
    _, gold_again = generate(server, replay, FIRST_TOKENS - REPLAYED_TOKENS, "gold")
    assert gold_again == output[REPLAYED_TOKENS:], "drafts never change greedy output"
    after_gold = settled_counters(server)
    assert after_gold["vllm:spec_decode_num_accepted_tokens_total"] > 0
    assert (after_gold["policies:spec_accepted_tokens_total"]
            == after_gold["vllm:spec_decode_num_accepted_tokens_total"])
    assert after_gold["withheld_bronze"] == 0

    _, bronze_again = generate(server, replay, FIRST_TOKENS - REPLAYED_TOKENS, "bronze")
    assert bronze_again == gold_again
    after_bronze = settled_counters(server)
    assert after_bronze["withheld_bronze"] > 0
    assert (after_bronze["vllm:spec_decode_num_draft_tokens_total"]
            == after_gold["vllm:spec_decode_num_draft_tokens_total"]), "no bronze draft verified"
    assert after_bronze["policies:spec_steps_total"] > after_gold["policies:spec_steps_total"]
