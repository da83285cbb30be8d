"""Every `Pipeline` slot is checked against a protocol, so a user's own class fills it: the
shipped classes implement them, an object lacking the methods is refused naming the slot,
and a user's start gate steers vLLM's real scheduler."""

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from policies import (
    WFQ,
    DecodeKVGate,
    PrefixWarmer,
    QuotaPolicy,
    SpeculationBudget,
    SpeculationPolicy,
    StartGate,
    TenantQuota,
    WarmingPolicy,
)


class EveryoneEligible:
    def eligible(self, backlogged, usage):
        return backlogged


class NoDrafts:
    reads_load = False

    def limit(self, slo_class, load=None):
        return 0


class NeverWarms:
    max_prefixes = 0

    def observe(self, block_keys, tokens, block_size, now):
        return False

    def next_to_warm(self, load, is_cached):
        return []

    def snapshot(self, now):
        return []

    def restore(self, records, block_keys, block_size, now):
        pass


class StartsAtMost:
    def __init__(self, count):
        self.count = count

    def startable(self, needed_blocks, *, used_blocks, total_blocks, running_requests,
                  block_size_tokens):
        return min(self.count, len(needed_blocks))


SLOTS = [
    ("quotas", QuotaPolicy, TenantQuota(), EveryoneEligible()),
    ("speculation", SpeculationPolicy, SpeculationBudget(), NoDrafts()),
    ("warming", WarmingPolicy, PrefixWarmer(), NeverWarms()),
    ("start_gate", StartGate, DecodeKVGate(), StartsAtMost(1)),
]


@pytest.mark.parametrize(("slot", "protocol", "shipped", "own"), SLOTS, ids=[s[0] for s in SLOTS])
def test_a_slot_takes_the_shipped_class_and_a_users_own(slot, protocol, shipped, own):
    fairness = {"fairness": WFQ()} if slot == "quotas" else {}
    for policy in (shipped, own):
        assert isinstance(policy, protocol)
        assert getattr(Pipeline(**fairness, **{slot: policy}), slot) is policy


@pytest.mark.parametrize(("slot", "protocol", "shipped", "own"), SLOTS, ids=[s[0] for s in SLOTS])
def test_a_slot_refuses_an_object_naming_the_slot_and_protocol(slot, protocol, shipped, own):
    fairness = {"fairness": WFQ()} if slot == "quotas" else {}
    with pytest.raises(TypeError, match=f"Pipeline.{slot} must implement {protocol.__name__}"):
        Pipeline(**fairness, **{slot: object()})


def test_a_users_start_gate_steers_vllms_scheduler():
    shape = EngineShape(num_blocks=64, block_size=16, max_num_batched_tokens=4096,
                        max_model_len=2048)
    harness = SchedulerHarness.build(Pipeline(start_gate=StartsAtMost(1)), shape=shape)
    for i in range(3):
        harness.add_request(f"r{i}", range(i * 1000, i * 1000 + 50), max_tokens=4)
    started = [len(harness.step().scheduler_output.scheduled_new_reqs) for _ in range(3)]
    assert started == [1, 1, 1]
