"""The pieces `run_vllm_scheduler_tests` relies on: the swapped scheduler classes build our
scheduler with the pipeline named (as ``--additional-config`` would), and the hub ids vLLM's
tests name resolve offline."""

import pytest

from integrations.vllm_v1.instruments import EngineShape
from integrations.vllm_v1.instruments.harness import build_scheduler
from integrations.vllm_v1.scheduling.scheduler import AsyncPolicyScheduler, PolicyScheduler
from integrations.vllm_v1.vllm_surface.names import ModelConfig
from policies import WFQ, QoSRanker
from tests.invariants import vllm_suite_plugin as plugin


def _rebuild(cls):
    stock = build_scheduler(EngineShape(num_blocks=16), None)
    return cls(vllm_config=stock.vllm_config, kv_cache_config=stock.kv_cache_config,
               structured_output_manager=stock.structured_output_manager,
               block_size=stock.block_size, log_stats=True)


@pytest.mark.parametrize(("name", "ranking", "fairness"), [
    ("identity", None, None), ("default", QoSRanker, WFQ), ("qos", QoSRanker, None)])
def test_the_swapped_classes_run_the_named_pipeline(name, ranking, fairness):
    sync, asynchronous = plugin._policy_classes(name)
    assert issubclass(sync, PolicyScheduler) and issubclass(asynchronous, AsyncPolicyScheduler)
    for cls in (sync, asynchronous):
        pipeline = _rebuild(cls).pipeline
        if ranking is None:
            assert not pipeline.reorders_requests
        else:
            assert isinstance(pipeline.ranking, ranking)
        assert isinstance(pipeline.fairness, fairness or type(None))
    if name == "default":
        assert _rebuild(sync).pipeline.fairness.weight("t0") == plugin.TENANT_WEIGHTS["t0"]


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(plugin.LOCAL_CONFIGS))
def test_the_hub_ids_of_vllms_tests_resolve_to_local_configs(model, tmp_path):
    config = plugin._model_config_factory(ModelConfig, tmp_path)(model=model, dtype="float16")
    assert config.max_model_len == 2048
    assert config.hf_config.model_type == "opt"
    assert plugin._local_model("llava-hf/llava-1.5-7b-hf", tmp_path) == "llava-hf/llava-1.5-7b-hf"


def test_only_failures_the_design_explains_are_set_aside():
    from tests.invariants.run_vllm_scheduler_tests import REFUSED, compare, explain

    order = "test_scheduler::test_schedule_order[True]"
    assert explain("qos", order, "assert 3 == 2") is not None  # ranks short prompts first
    assert explain("wfq", order, "assert 3 == 2") is None  # FCFS within a tenant: a bug
    assert explain("identity", "test_scheduler::test_priority_scheduling_basic_ordering",
                   f"ValueError: {REFUSED} ...") is not None
    assert explain("identity", "test_scheduler::test_preempt_during_execution", "x") is None
    assert explain("pd-decode", "test_scheduler::test_preempt_during_execution", "x")
    summary = compare({
        "stock": {order: ("pass", ""), "a::b": ("pass", ""), "a::c": ("fail", "hub")},
        "wfq": {order: ("fail", "assert 3 == 2"), "a::b": ("pass", ""), "a::c": ("pass", "")},
    })
    assert summary["wfq"]["unexplained"] == {order: "assert 3 == 2"}
    assert summary["wfq"]["pass_where_stock_fails"] == ["a::c"]
