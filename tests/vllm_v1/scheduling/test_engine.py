"""The pipeline inside a real vLLM engine (tiny random-weight model, CPU)."""

import gc

import pytest

from integrations.vllm_v1 import Pipeline, build_llm
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from policies import QoSRanker
from tests.helpers.engine import ENGINE_KWARGS, PREEMPT_AT_ONCE_SLO

pytestmark = pytest.mark.engine

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "1, 2, 3, 4,", "My favourite colour is"]


def greedy(llm, max_tokens=12):
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens),
                           use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def finish_order(llm, requests):
    """Submit (id, prompt, max_tokens, priority) in order; return ids in finishing order and
    each request's greedy tokens."""
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    engine = llm.llm_engine
    for request_id, prompt, max_tokens, priority in requests:
        engine.add_request(request_id, prompt,
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                           priority=priority)
    order, tokens = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                order.append(out.request_id)
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    return order, tokens


def rejected_offline(llm):
    """An offline request the scheduler rejects: (finish_reason, stop_reason)."""
    from integrations.vllm_v1.vllm_surface.names import SamplingParams

    out = llm.generate(["Hi"], SamplingParams(max_tokens=4), priority=99, use_tqdm=False)[0]
    return out.outputs[0].finish_reason, out.outputs[0].stop_reason


CONTENTION = [
    ("blocker", "Tell me a long story about " * 4, 48, 0),
    ("relaxed-long", "Summarise this document: " + "lorem ipsum dolor " * 40, 8, 5),
    ("urgent-short", "Hi", 8, -5),
]


@pytest.fixture(scope="module")
def engines(random_model_dir):
    """Stock vLLM, the identity pipeline, the QoS pipeline and the ``slo`` preset preempting
    a slot for any more urgent request at once, one engine at a time."""
    from integrations.vllm_v1.vllm_surface.names import LLM

    results = {}
    kwargs = {**ENGINE_KWARGS, "model": random_model_dir, "max_num_seqs": 1}
    slo = slo_pipeline(SLOSpec.parse(PREEMPT_AT_ONCE_SLO))
    for name, make in [("stock", lambda: LLM(**kwargs)),
                       ("identity", lambda: build_llm(Pipeline(), **kwargs)),
                       ("qos", lambda: build_llm(Pipeline(ranking=QoSRanker()), **kwargs)),
                       ("slo", lambda: build_llm(slo, **kwargs))]:
        llm = make()
        order, tokens = finish_order(llm, CONTENTION)
        results[name] = {"greedy": greedy(llm), "order": order, "tokens": tokens,
                         "scheduler": llm.llm_engine.vllm_config.scheduler_config.scheduler_cls}
        if name == "qos":
            results[name]["rejected"] = rejected_offline(llm)
            results[name]["after_rejection"] = greedy(llm)
        del llm
        gc.collect()
    return results


def test_engines_run_the_scheduler_they_were_given(engines):
    assert engines["stock"]["scheduler"] is None
    assert engines["identity"]["scheduler"].endswith("PolicyScheduler")
    assert engines["qos"]["scheduler"].endswith("PolicyScheduler")


def test_identity_pipeline_gives_token_identical_greedy_outputs(engines):
    stock = engines["stock"]["greedy"]
    assert len({tuple(tokens) for tokens in stock}) > 1, "outputs must depend on the prompt"
    assert engines["identity"]["greedy"] == stock


def test_qos_serves_the_urgent_short_request_before_the_relaxed_long_one(engines):
    # One request runs at a time (max_num_seqs=1); the blocker keeps the others queued.
    stock, qos = engines["stock"]["order"], engines["qos"]["order"]
    assert sorted(stock) == sorted(qos) == sorted(name for name, *_ in CONTENTION)
    assert stock.index("relaxed-long") < stock.index("urgent-short")
    assert qos.index("urgent-short") < qos.index("relaxed-long")


def test_offline_rejection_is_an_abort_with_its_reason_and_the_engine_keeps_serving(engines):
    finish_reason, stop_reason = engines["qos"]["rejected"]
    assert finish_reason == "abort"
    assert stop_reason.startswith("rejected:invalid_metadata:priority must be between")
    assert stop_reason.endswith(";retry_after_s=0")
    assert engines["qos"]["after_rejection"] == engines["qos"]["greedy"]


def test_slot_preemption_starts_the_urgent_request_and_the_victim_recomputes_exactly(engines):
    # The blocker starts first (earliest first-token deadline) and takes the one slot; the
    # urgent request preempts it (vLLM itself preempts only for KV blocks), so it finishes
    # first; the blocker resumes right behind it and, recomputed, yields the very tokens it
    # yields unpreempted.
    slo, stock = engines["slo"], engines["stock"]
    assert slo["order"] == ["urgent-short", "blocker", "relaxed-long"]
    assert stock["order"][0] == "blocker"
    assert slo["tokens"] == stock["tokens"]
    assert slo["greedy"] == stock["greedy"]
