"""Cache efficiency metrics: segment sizes, evictions and retention by reason, hits by tenant."""

from prometheus_client import CollectorRegistry

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.cache.eviction_metrics import report_eviction
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness
from integrations.vllm_v1.metrics import PolicyMetrics
from policies import SegmentedLRU
from policies.kv.eviction import DuelingSLRU, SessionPins
from policies.kv.prompt_versions import PromptVersions
from tests.helpers.drain import drain


def make():
    registry = CollectorRegistry()
    return PolicyMetrics(refresh_interval_s=1.0, registry=registry), registry


def refresh(metrics, order):
    metrics.refresh(waiting=[], running=[], fairness=None, watermarks=None, kv_usage=0.0)
    report_eviction(metrics, order.stats())


def test_eviction_gauges_and_counters_follow_the_orders_stats():
    metrics, registry = make()
    order = SegmentedLRU(prompt_versions=PromptVersions())
    for i in range(50):
        order.release(i)
    order.release("sys", protect=True)
    order.release_cancelled("code")
    order.release_uncached("free")
    refresh(metrics, order)

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("policies:kv_evictable_blocks", segment="probation") == 50
    assert value("policies:kv_evictable_blocks", segment="protected") == 2
    assert value("policies:kv_evictable_blocks", segment="uncached") == 1
    assert value("policies:kv_retained_blocks_total", reason="preempted") == 1
    assert value("policies:kv_retained_blocks_total", reason="cancelled") == 1
    for _ in range(3):
        order.evict()
    order.observe_prompt("acme", "sys", "1")
    order.observe_prompt("acme", "new", "2")
    refresh(metrics, order)
    refresh(metrics, order)  # counters count each eviction once
    assert value("policies:kv_evictions_total", segment="uncached") == 1
    assert value("policies:kv_evictions_total", segment="probation") == 2
    assert value("policies:kv_demoted_blocks_total", reason="stale") == 1
    assert value("policies:kv_evictable_blocks", segment="protected") == 1


def test_session_pins_are_counted_by_event():
    metrics, registry = make()
    order = DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=0.3, default_gap_s=10.0,
                                                  judged=False))
    for i in range(6):
        order.release(i)
    session = order.turn_started("agent-1", ["a1", "a2", "a3", "a4"], now=0.0)
    for key in ["a4", "a3", "a2", "a1"]:
        order.release(key)
    order.turn_finished(session, ["a1", "a2", "a3", "a4"], now=0.0)  # 10 tracked: 3 pinnable
    order.release("n1")
    # 0-5 and a4 go; a3, a2, a1 would go next: the pins hold them (in PINNED), n1 goes
    assert [order.evict() for _ in range(8)] == [0, 1, 2, 3, 4, 5, "a4", "n1"]
    order.acquire("a1")  # the next turn hits a block its pin kept
    order.turn_started("agent-2", ["b1"], now=100.0)  # the others' pins expired
    refresh(metrics, order)

    def value(event):
        return registry.get_sample_value("policies:kv_session_pins_total", {"event": event})

    assert (value("pinned"), value("hit"), value("expired"), value("refused")) == (3, 1, 2, 1)
    assert registry.get_sample_value("policies:kv_evictable_blocks", {"segment": "pinned"}) == 0


def test_blocks_kept_for_waiting_requests_and_their_hits_are_exported():
    metrics, registry = make()
    order = SegmentedLRU()
    for key in ["w3", "w2", "w1", "x"]:
        order.release(key)
    order.expect(["w1", "w2", "w3"])
    order.acquire("w1")
    refresh(metrics, order)
    assert registry.get_sample_value("policies:kv_evictable_blocks", {"segment": "wanted"}) == 2
    assert registry.get_sample_value("policies:kv_wanted_hits_total", {"queue": "waiting"}) == 1


def test_prefix_hits_by_tenant_through_the_scheduler():
    harness = SchedulerHarness.build(Pipeline(eviction=SegmentedLRU()),
                                     shape=EngineShape(num_blocks=64, max_model_len=1024))
    registry = CollectorRegistry()
    harness.scheduler.metrics = PolicyMetrics(registry=registry)
    prompt = [5 + i % 50 for i in range(160)]
    for request_id, tenant in [("a", "acme"), ("b", "acme"), ("c", "globex")]:
        harness.add_request(request_id, prompt + [len(request_id)], 1,
                            extra_args={"tenant": tenant})
        while harness.has_requests():
            harness.step()
    tokens = {t: registry.get_sample_value("policies:prefix_cache_prompt_tokens_total",
                                           {"tenant": t}) for t in ("acme", "globex")}
    hits = {t: registry.get_sample_value("policies:prefix_cache_hit_tokens_total",
                                         {"tenant": t}) for t in ("acme", "globex")}
    assert tokens == {"acme": 322, "globex": 161}
    assert hits == {"acme": 160, "globex": 160}  # every request after the first hits 10 blocks
    assert registry.get_sample_value("policies:kv_evictable_blocks",
                                     {"segment": "protected"}) == 10


def test_session_pins_by_tenant_through_the_scheduler():
    """Each tenant's finished turns hold pins charged to it: ``kv_session_pinned_blocks``."""
    harness = SchedulerHarness.build(Pipeline(eviction=DuelingSLRU(
                                         session_pins=SessionPins(judged=False))),
                                     shape=EngineShape(num_blocks=64, max_model_len=1024))
    registry = CollectorRegistry()
    harness.scheduler.metrics = PolicyMetrics(registry=registry)
    for index, tenant in enumerate(["acme", "acme", "globex"]):
        prompt = [5 + (7 * index + i) % 50 for i in range(64)]  # 4 blocks, a prompt each
        harness.add_request(f"r{index}", prompt, 1, extra_args={"tenant": tenant},
                            session_id=f"{tenant}-{index}")
        drain(harness, limit=100)
    pinned = {t: registry.get_sample_value("policies:kv_session_pinned_blocks", {"tenant": t})
              for t in ("acme", "globex")}
    assert pinned == {"acme": 8, "globex": 4}  # each prompt's 4 blocks, charged to its tenant
