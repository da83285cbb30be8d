"""The scheduling policies composed in PolicyScheduler, through the real vLLM scheduler."""

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.vllm_surface.names import RequestStatus
from policies import MLFQ, WFQ, EDFRanker, KVWatermarks, QoSRanker, TenantQuota, TokenBucket
from tests.helpers.drain import drain


def test_wfq_shares_service_by_weight_while_both_tenants_are_backlogged():
    wfq = WFQ(weights={"gold": 2.0, "bronze": 1.0}, output_token_cost=1.0)
    harness = SchedulerHarness.build(Pipeline(fairness=wfq),
                                     shape=EngineShape(max_num_seqs=1, max_num_batched_tokens=64))
    for i in range(30):
        for offset, tenant in enumerate(("bronze", "gold")):  # bronze always arrives first
            start = (2 * i + offset) * 100  # no shared prefixes: every token is computed
            harness.add_request(f"{tenant}-{i}", range(start, start + 40), 8,
                                extra_args={"tenant": tenant})
    _, finished, _ = drain(harness)
    cost = 40 + 7  # prompt + decoded tokens (the first output token comes with the prefill)
    # While both are backlogged (until gold runs dry), weighted service stays within the
    # WFQ bound M/w_gold + M/w_bronze of each other, with M one request's cost.
    gold_done = finished.index("gold-29") + 1
    bronze = sum(name.startswith("bronze") for name in finished[:gold_done])
    assert abs(30 * cost / 2 - bronze * cost / 1) <= cost / 2 + cost / 1
    assert 14 <= bronze <= 16


def test_mlfq_skip_join_serves_short_prompts_before_long_ones():
    harness = SchedulerHarness.build(Pipeline(levels=MLFQ()),
                                     shape=EngineShape(max_num_seqs=1, max_num_batched_tokens=256))
    harness.add_request("long", range(3000), 4)
    harness.add_request("medium", range(5000, 5400), 4)
    harness.add_request("short", range(9000, 9100), 4)
    _, finished, _ = drain(harness)
    assert finished == ["short", "medium", "long"]


def test_edf_drops_waiting_requests_that_can_no_longer_meet_their_deadline():
    harness = SchedulerHarness.build(
        Pipeline(ranking=EDFRanker(decode_s_per_token=0.01, prefill_s_per_token=1e-4)),
        shape=EngineShape(max_num_seqs=1, max_num_batched_tokens=512))
    harness.add_request("blocker", range(100), 200)  # runs ~2 s of virtual time
    harness.step()  # the blocker is running before the others arrive
    harness.add_request("tight", range(200, 300), 10, extra_args={"deadline_ms": 500})
    harness.add_request("relaxed", range(400, 500), 10, extra_args={"deadline_ms": 60000})
    _, finished, outputs = drain(harness)
    reasons = {o.request_id: o.stop_reason for o in outputs if o.finish_reason is not None}
    assert reasons["tight"].startswith("rejected:deadline_expired")
    assert reasons["relaxed"] is None and reasons["blocker"] is None
    assert sorted(finished) == ["blocker", "relaxed", "tight"]


def test_deadlines_slot_drops_expired_requests_while_qos_keeps_the_order():
    deadlines = EDFRanker(decode_s_per_token=0.01, prefill_s_per_token=1e-4)
    harness = SchedulerHarness.build(
        Pipeline(ranking=QoSRanker(), deadlines=deadlines),
        shape=EngineShape(max_num_seqs=1, max_num_batched_tokens=512))
    harness.add_request("blocker", range(100), 200)  # runs ~2 s of virtual time
    harness.step()
    # QoS serves the urgent priority first, although EDF would pick the tight deadline.
    harness.add_request("relaxed-urgent", range(200, 300), 10, priority=-5,
                        extra_args={"deadline_ms": 60000})
    harness.add_request("tight", range(400, 500), 10, priority=5,
                        extra_args={"deadline_ms": 500})
    harness.add_request("tight-feasible", range(600, 700), 10, priority=5,
                        extra_args={"deadline_ms": 20000})
    _, finished, outputs = drain(harness)
    reasons = {o.request_id: o.stop_reason for o in outputs if o.finish_reason is not None}
    assert reasons["tight"].startswith("rejected:deadline_expired")
    served = [r for r in finished if reasons[r] is None]
    assert served == ["blocker", "relaxed-urgent", "tight-feasible"]


def test_token_bucket_throttles_a_low_priority_prefill_within_its_bound():
    bucket = TokenBucket(capacity_tokens=64, min_refill_per_s=64.0, max_refill_per_s=64.0)
    harness = SchedulerHarness.build(Pipeline(ranking=QoSRanker(), rate=bucket),
                                     shape=EngineShape(max_num_batched_tokens=1024))
    harness.add_request("low", range(300), 2, priority=3)
    harness.add_request("high", range(5000, 7000), 2, priority=-3)
    steps, _, _ = drain(harness)
    low = [(t, s.get("low", 0)) for t, s in steps]
    high = [s.get("high", 0) for _, s in steps]
    assert high[0] == 1024  # unlimited: takes the whole budget
    first = next(i for i, (_, n) in enumerate(low) if n)
    running = low[first:]
    assert any(n == 0 for _, n in running[:20]), "a running capped prefill is skipped at times"
    start, granted = running[0][0], 0
    for t, n in running:
        granted += n
        if granted < 300:  # still prefilling: the bucket bounds it
            assert granted <= 64 + 64 * (t - start) + 1e-6


def test_full_default_pipeline_accounts_for_every_request():
    from integrations.vllm_v1.config.presets import default_pipeline

    harness = SchedulerHarness.build(default_pipeline(), shape=EngineShape(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=128))
    for i in range(24):
        harness.add_request(f"r{i}", range(i * 1000, i * 1000 + 30 + 20 * i), 5 + i % 7,
                            priority=i % 3 - 1, extra_args={"tenant": f"t{i % 7}"})
    _, finished, _ = drain(harness)
    assert sorted(finished) == sorted(f"r{i}" for i in range(24))
    harness.scheduler.pipeline.fairness.check_invariants()
    harness.scheduler.pipeline.levels.check_invariants()


def running_share_while_both_wait(quotas):
    """Most running slots tenant ``chatty`` held while ``bulk`` had requests waiting."""
    pipeline = Pipeline(fairness=WFQ(), quotas=quotas)
    harness = SchedulerHarness.build(pipeline, shape=EngineShape(max_num_seqs=4,
                                                                 max_num_batched_tokens=4096))
    for i in range(12):  # chatty: short prompts, long answers; bulk: long prompts, short answers
        harness.add_request(f"chatty-{i}", range(i * 50, i * 50 + 16), 60,
                            extra_args={"tenant": "chatty"})
        harness.add_request(f"bulk-{i}", range(10_000 + i * 2000, 10_000 + i * 2000 + 1500), 4,
                            extra_args={"tenant": "bulk"})
    most = 0
    scheduler = harness.scheduler
    while harness.has_requests():
        harness.step()
        harness.clock.advance(0.01)
        if any(scheduler._tenant_of(r) == "bulk" for r in scheduler.waiting):
            most = max(most, sum(scheduler._tenant_of(r) == "chatty" for r in scheduler.running))
    return most


def test_tenant_quota_holds_a_tenant_to_its_share_of_running_slots_while_others_wait():
    assert running_share_while_both_wait(None) > 2  # WFQ alone lets chatty hog the slots
    assert running_share_while_both_wait(TenantQuota()) <= 2  # equal weights: half of 4


def test_quotas_need_a_fairness_policy():
    with pytest.raises(ValueError, match="quotas needs a fairness policy"):
        Pipeline(quotas=TenantQuota())


def _long_prefill_high_water(waiting_behind: bool, quota_blocks: int | None = 8) -> int:
    """Most tokens a 600-token prompt computes behind a running head, under a quota of
    ``quota_blocks`` (8 blocks of 16 tokens; None: none), with or without a third request
    waiting for a slot (two slots)."""
    watermarks = KVWatermarks(base_quota_blocks=quota_blocks, min_quota_blocks=4)
    harness = SchedulerHarness.build(
        Pipeline(watermarks=watermarks),
        shape=EngineShape(num_blocks=64, block_size=16, max_num_batched_tokens=256,
                          max_num_seqs=2))
    harness.add_request("head", range(100), 40)
    harness.step()  # head runs: the quota applies to everyone behind it
    long_request = harness.add_request("long", range(1000, 1600), 2)
    if waiting_behind:
        harness.add_request("third", range(2000, 2050), 2)  # no slot: it waits
    most = 0
    while harness.scheduler.requests.get("head") is not None:
        harness.step()
        harness.clock.advance(0.01)
        most = max(most, long_request.num_computed_tokens)
    drain(harness)
    assert not harness.has_requests()  # alone at the head, it is no longer held
    return most


def test_kv_watermark_quota_holds_a_long_prefill_while_requests_wait():
    assert 0 < _long_prefill_high_water(waiting_behind=True) <= 8 * 16  # held at its quota


def test_kv_watermarks_without_a_block_quota_never_hold_a_prefill():
    assert _long_prefill_high_water(waiting_behind=True, quota_blocks=None) >= 600  # whole


def test_kv_watermark_quota_leaves_a_long_prefill_alone_when_nothing_waits():
    assert _long_prefill_high_water(waiting_behind=False) > 8 * 16  # nobody to leave room for


def test_kv_watermark_quota_never_stalls_the_engine():
    # A quota far below every prompt: the head of the running list still progresses.
    harness = SchedulerHarness.build(
        Pipeline(watermarks=KVWatermarks(base_quota_blocks=1, min_quota_blocks=1)),
        shape=EngineShape(num_blocks=256, block_size=16, max_num_seqs=4,
                          max_num_batched_tokens=64))
    for i in range(4):
        harness.add_request(f"r{i}", range(i * 1000, i * 1000 + 300), 3)
    _, finished, _ = drain(harness)
    assert sorted(finished) == ["r0", "r1", "r2", "r3"]


def test_wfq_charges_only_tokens_actually_scheduled():
    """A request vLLM pops but skips (here: its grammar is still compiling) costs its
    tenant nothing; once it runs, its tenant pays exactly the chunks scheduled."""
    wfq = WFQ(output_token_cost=1.0)
    harness = SchedulerHarness.build(Pipeline(fairness=wfq),
                                     shape=EngineShape(max_num_seqs=4, max_num_batched_tokens=64))
    blocked = harness.add_request("blocked", range(200), 2, extra_args={"tenant": "a"})
    blocked.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    harness.add_request("other", range(1000, 1010), 2, extra_args={"tenant": "b"})
    engine_wfq = harness.scheduler.pipeline.fairness
    for _ in range(3):
        harness.step()
        harness.clock.advance(0.01)
    assert "blocked" not in harness.scheduler.running
    assert engine_wfq.stats().input_tokens.get("a", 0) == 0
    blocked.status = RequestStatus.WAITING  # grammar ready
    charged = []
    while blocked.num_computed_tokens < 200:
        harness.step()
        harness.clock.advance(0.01)
        charged.append(engine_wfq.stats().input_tokens["a"])
    assert charged == [64, 128, 192, 200]  # chunks of the 64-token budget, no more
    engine_wfq.check_invariants()


def test_edf_demotes_a_running_request_once_it_is_late():
    """A running request whose deadline can no longer be met goes behind the on-time ones:
    served last and first in line for preemption."""
    harness = SchedulerHarness.build(
        Pipeline(ranking=EDFRanker(decode_s_per_token=0.01, prefill_s_per_token=1e-4)),
        shape=EngineShape(max_num_seqs=4, max_num_batched_tokens=512))
    harness.add_request("tight", range(100), 40, extra_args={"deadline_ms": 1000})
    harness.add_request("relaxed", range(200, 300), 40, extra_args={"deadline_ms": 60000})
    orders = []
    for _ in range(8):
        harness.step()
        orders.append([r.request_id for r in harness.scheduler.running])
        harness.clock.advance(0.1)  # ~0.4 s of estimated decoding left: late after a few steps
    assert orders[1] == ["tight", "relaxed"]  # earliest deadline first while on time
    assert orders[-1] == ["relaxed", "tight"]  # late: demoted behind the on-time request
