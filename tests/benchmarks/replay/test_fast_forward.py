"""Fast-forward is exact: every record and counter equals the step-by-step replay's.

Each system replays the same traces twice, with and without fast-forward, under shapes
tight enough to preempt, evict cached prefixes, fill the running list while requests
wait, and cancel requests mid-decode. Systems whose policies watch every step
(fairness, levels, deadlines, per-step hooks) must not be fast-forwarded at all.
"""

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import build_harness, replay
from benchmarks.replay.fast_forward import unsupported_reason
from benchmarks.replay.trace import Trace, TraceRequest
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.instruments import EngineShape

COST = StepCostModel.preset("h100")
TIGHT = EngineShape(num_blocks=700, max_num_seqs=8, max_num_batched_tokens=1024,
                    max_model_len=8192)
FAST = ["fcfs", "priority", "pipeline:identity", "pipeline:qos", "pipeline:rate",
        "pipeline:admission", "pipeline:watermarks", "pipeline:slru", "pipeline:cache"]
STEPWISE = ["pipeline:default", "pipeline:wfq", "pipeline:mlfq", "pipeline:edf"]
SLOW = {"pipeline:slru", "pipeline:cache", "pipeline:mlfq"}
"""The systems whose replays take tens of seconds (left out of ``make test-fast``)."""


def _systems(systems):
    return [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in systems]


def _state(run):
    """Everything a replay reports except its own speed."""
    records = [attrs.asdict(r) for r in run.records]
    counters = attrs.asdict(run, filter=lambda a, _v: a.name not in (
        "records", "wall_s", "fast_forwarded_steps"))
    return records, counters


def _both(trace, system, shape):
    stepwise = replay(trace, system, shape=shape, cost_model=COST, fast_forward=False)
    fast = replay(trace, system, shape=shape, cost_model=COST)
    assert stepwise.fast_forwarded_steps == 0
    return stepwise, fast


@pytest.fixture(scope="module")
def enterprise():
    # tenants, priorities, SLO classes, cancellations and a shared system prompt per tenant
    return load_workload("enterprise", max_requests=90)


@pytest.fixture(scope="module")
def mooncake():
    trace = load_workload("mooncake-conv", max_requests=60)
    small = [attrs.evolve(r, prompt_tokens=min(r.prompt_tokens, 3000),
                          block_hashes=r.block_hashes[:6], output_tokens=min(r.output_tokens, 120))
             for r in trace.requests]
    return Trace(name="mooncake-small", requests=tuple(small), block_size=trace.block_size)


@pytest.mark.parametrize("system", _systems(FAST + STEPWISE))
def test_records_equal_the_step_by_step_replay(system, enterprise):
    stepwise, fast = _both(enterprise, system, TIGHT)
    assert _state(fast) == _state(stepwise)
    if system in FAST:
        assert fast.fast_forwarded_steps > 0
        if system in ("fcfs", "pipeline:cache"):  # a KV-blocked queue does not stop it
            assert fast.fast_forwarded_steps > fast.steps / 2
    else:
        assert fast.fast_forwarded_steps == 0


@pytest.mark.parametrize("system", _systems(["fcfs", "pipeline:slru", "pipeline:cache"]))
def test_prefix_hits_and_evictions_are_unchanged(system, mooncake):
    # 60 Mooncake requests sharing 512-token blocks, in a cache that must evict them
    shape = EngineShape(num_blocks=420, max_num_seqs=6, max_num_batched_tokens=2048,
                        max_model_len=8192)
    stepwise, fast = _both(mooncake.scaled(4.0), system, shape)
    assert _state(fast) == _state(stepwise)
    assert sum(r.cached_tokens for r in stepwise.records) > 0
    assert stepwise.preemptions > 0
    assert fast.fast_forwarded_steps > 0


def test_the_engine_ends_in_the_same_state():
    trace = load_workload("azure-conv", max_requests=40)
    harnesses = {}
    for fast in (False, True):
        harness = harnesses[fast] = build_harness("fcfs", TIGHT)
        replay(trace, "fcfs", shape=TIGHT, cost_model=COST, harness=harness, fast_forward=fast)
    pools = [h.scheduler.kv_cache_manager.block_pool for h in harnesses.values()]
    # the free queue: the same cached contents in the same eviction order
    queues = [[block.block_hash for block in pool.free_block_queue.get_all_free_blocks()]
              for pool in pools]
    assert queues[0] == queues[1]
    assert sum(h is not None for h in queues[0]) > 100


@pytest.mark.parametrize(("system", "reason"), [
    ("pipeline:default", "fairness"), ("pipeline:wfq", "fairness"),
    ("pipeline:mlfq", "levels"), ("pipeline:edf", "deadline"),
    ("pipeline:pd-decode", "before_schedule")])
def test_policies_that_watch_every_step_turn_it_off(system, reason):
    assert reason in unsupported_reason(build_harness(system, TIGHT))


@pytest.mark.parametrize("system", ["fcfs", "pipeline:cache"])
def test_supported_systems_have_no_reason(system):
    assert unsupported_reason(build_harness(system, TIGHT)) is None


rows = st.lists(
    st.tuples(st.floats(0, 2), st.integers(1, 700), st.integers(1, 90),
              st.one_of(st.none(), st.floats(0.01, 1.5)), st.integers(-1, 1),
              st.sampled_from([(), (1,), (1, 2), (3,)])),
    min_size=1, max_size=20)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows, system=st.sampled_from(["fcfs", "priority", "pipeline:cache",
                                          "pipeline:slru", "pipeline:rate"]),
       seqs=st.integers(1, 5), block_size=st.sampled_from([16, 32]))
def test_random_traces_replay_identically(rows, system, seqs, block_size):
    trace = Trace(name="random", block_size=64, requests=tuple(
        TraceRequest(request_id=f"r{i}", arrival_s=arrival, prompt_tokens=prompt,
                     output_tokens=output, cancel_after_s=cancel, priority=priority,
                     block_hashes=hashes[: -(-prompt // 64)])
        for i, (arrival, prompt, output, cancel, priority, hashes) in enumerate(rows)))
    shape = EngineShape(num_blocks=1024 // block_size * 2, block_size=block_size,
                        max_num_seqs=seqs, max_num_batched_tokens=256, max_model_len=1024)
    stepwise, fast = _both(trace, system, shape)
    assert _state(fast) == _state(stepwise)
