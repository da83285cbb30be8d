"""The replay harness reproduces a live CPU engine's scheduling decisions, and the
cost model calibrates to the live engine's measured step times."""

import gc

import pytest

from benchmarks.replay.calibrate import calibrate, samples_from_step_log
from benchmarks.replay.cost_model import StepCostModel
from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.instruments.step_log import read_step_log, step_log_engine_kwargs
from tests.helpers.engine import ENGINE_KWARGS

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def step_log(random_model_dir, tmp_path_factory):
    """A live engine's log: 8 requests of mixed lengths, chunked prefill, 3 slots."""
    from integrations.vllm_v1.vllm_surface.names import LLM, SamplingParams

    path = tmp_path_factory.mktemp("fidelity") / "steps.jsonl"
    kwargs = step_log_engine_kwargs(Pipeline(), path, model=random_model_dir,
                                    **{**ENGINE_KWARGS, "max_num_seqs": 3,
                                       "max_num_batched_tokens": 96})
    llm = LLM(**kwargs)
    prompts = [[(13 * i + j) % 4000 + 6 for j in range(20 + 45 * i)] for i in range(8)]
    prompts[5] = prompts[1][:40] + prompts[5][40:]  # a shared prefix: a prefix-cache hit
    params = [SamplingParams(max_tokens=3 + 4 * (i % 4), ignore_eos=True, temperature=0)
              for i in range(8)]
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    del llm
    gc.collect()
    return read_step_log(path)


def replay_log(events):
    """Feed the logged arrivals to the harness at the logged steps; its per-step schedule."""
    config = events[0]
    shape = EngineShape(num_blocks=config["num_blocks"], block_size=config["block_size"],
                        max_num_seqs=config["max_num_seqs"],
                        max_num_batched_tokens=config["max_num_batched_tokens"],
                        max_model_len=config["max_model_len"],
                        long_prefill_token_threshold=config["long_prefill_token_threshold"])
    harness = SchedulerHarness.build(Pipeline(), shape=shape)
    adds = [e for e in events if e["event"] == "add"]
    schedule, step = [], 0
    while adds or harness.has_requests():
        while adds and adds[0]["step"] <= step:
            add = adds.pop(0)
            harness.add_request(add["request_id"], add["prompt_token_ids"], add["max_tokens"],
                                priority=add["priority"])
        scheduled = dict(harness.step().scheduler_output.num_scheduled_tokens)
        if scheduled:
            schedule.append((step, scheduled))
        step += 1
    return schedule


def test_harness_makes_the_same_scheduling_decisions_as_the_live_engine(step_log):
    live = [(e["step"], e["scheduled"]) for e in step_log if e["event"] == "step"]
    assert len(live) > 20
    assert any(k > 0 for e in step_log if e["event"] == "step" for _, k in e["prefills"])
    assert replay_log(step_log) == live


def test_cost_model_calibrates_to_the_live_engine(step_log):
    samples = samples_from_step_log(step_log)
    report = calibrate(samples, StepCostModel.preset("h100"))
    # An H100 model is far off for a CPU; the fit must explain the CPU's own times better.
    assert report["median_rel_error_after"] < report["median_rel_error_before"]
    assert report["median_rel_error_after"] < 0.5
    assert all(v >= 0 for v in report["cost_model"].values())
