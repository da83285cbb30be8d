"""`PolicyMetrics`: labels, caps and stale label sets, read from a private registry."""

from prometheus_client import CollectorRegistry

from integrations.vllm_v1.metrics import MAX_TENANT_LABELS, PolicyMetrics, Series
from integrations.vllm_v1.scheduling.start_gate import report_start_gate
from integrations.vllm_v1.slo.admission_metrics import report_slo_admission
from policies import WFQ, DecodeStepGateStats, KVWatermarks, SLOAdmissionStats


def make():
    registry = CollectorRegistry()
    return PolicyMetrics(refresh_interval_s=1.0, registry=registry), registry


def test_counters_add_up_by_reason_and_tenant():
    metrics, registry = make()
    for reason in ("queue_full", "queue_full", "kv_red"):
        metrics.rejected(reason)
    metrics.throttled("acme", 30)
    metrics.throttled("acme", 12)
    assert registry.get_sample_value("policies:rejections_total", {"reason": "queue_full"}) == 2
    assert registry.get_sample_value("policies:rejections_total", {"reason": "kv_red"}) == 1
    assert registry.get_sample_value("policies:prefill_tokens_throttled_total",
                                     {"tenant": "acme"}) == 42


def test_gauges_follow_the_queue_and_drop_to_zero_when_a_label_set_empties():
    metrics, registry = make()
    fairness = WFQ(weights={"gold": 2.0})
    fairness.on_backlogged("gold")
    fairness.on_backlogged("free")
    fairness.charge("gold", input_tokens=100)
    metrics.refresh(waiting=[("gold", 0), ("gold", 0), ("free", 2)], running=["gold"],
                    fairness=fairness, watermarks=KVWatermarks(), kv_usage=0.9)

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    assert value("policies:waiting_requests", tenant="gold", level="0") == 2
    assert value("policies:waiting_requests", tenant="free", level="2") == 1
    assert value("policies:running_requests", tenant="gold") == 1
    assert value("policies:fairness_lag_tokens", tenant="gold") == 50  # 100 tokens / weight 2
    assert value("policies:fairness_lag_tokens", tenant="free") == 0
    assert value("policies:kv_watermark_level") == 2  # red at 90 %
    metrics.refresh(waiting=[("free", 2)], running=[], fairness=None, watermarks=None,
                    kv_usage=0.1)
    assert value("policies:waiting_requests", tenant="gold", level="0") == 0
    assert value("policies:running_requests", tenant="gold") == 0


def test_refresh_is_due_once_per_interval():
    metrics, _ = make()
    assert [metrics.due(t) for t in (0.0, 0.5, 0.99, 1.0, 1.5, 2.1)] == [
        True, False, False, True, False, True]


def test_tenant_labels_are_capped():
    metrics, _ = make()
    labels = [metrics.tenant_label(f"t{i}") for i in range(MAX_TENANT_LABELS + 5)]
    assert labels[:MAX_TENANT_LABELS] == [f"t{i}" for i in range(MAX_TENANT_LABELS)]
    assert set(labels[MAX_TENANT_LABELS:]) == {"other"}
    assert metrics.tenant_label("t0") == "t0"


def test_start_gate_bound_and_held_counter_follow_the_gate_totals():
    metrics, registry = make()
    report_start_gate(metrics, DecodeStepGateStats(step_bound_s=None, fixed_step_s=0.005, calls=3,
                                           held_by_step=0))
    assert registry.get_sample_value("policies:decode_step_bound_seconds") == 0.0  # unset
    report_start_gate(metrics, DecodeStepGateStats(step_bound_s=0.0156, fixed_step_s=0.0078,
                                           calls=10, held_by_step=4))
    report_start_gate(metrics, DecodeStepGateStats(step_bound_s=0.0150, fixed_step_s=0.0075,
                                           calls=12, held_by_step=6))
    assert registry.get_sample_value("policies:decode_step_bound_seconds") == 0.0150
    assert registry.get_sample_value("policies:start_gate_held_by_step_total") == 6


def test_slo_admission_gauges_and_demotions_follow_the_admission_totals():
    metrics, registry = make()
    for demoted, p90 in ((2, None), (5, 0.12)):
        report_slo_admission(metrics, SLOAdmissionStats(
            admitted=10, demoted=demoted, rejected={}, unclassified=0, tracked=3,
            headroom=0.78, ttft_error_p90=p90))
    assert registry.get_sample_value("policies:slo_headroom") == 0.78
    assert registry.get_sample_value("policies:slo_ttft_error_p90") == 0.12
    assert registry.get_sample_value("policies:slo_admitted_tracked") == 3
    assert registry.get_sample_value("policies:slo_demotions_total") == 5


def test_a_features_series_count_each_event_once_and_drop_stale_label_sets():
    metrics, registry = make()
    total = Series("policies:test_events", "Events", ("kind",), counter=True)
    level = Series("policies:test_level", "Level", ("tenant",))
    for seen in (3, 3, 5, 4):  # a policy's running total, read at each refresh
        metrics.count_to(total, seen, kind="a")
    metrics.count(total, 2, kind="b")
    metrics.show(level, {("gold",): 2.0, ("free",): 1.0})
    metrics.show(level, {("free",): 4.0})
    assert registry.get_sample_value("policies:test_events_total", {"kind": "a"}) == 5
    assert registry.get_sample_value("policies:test_events_total", {"kind": "b"}) == 2
    assert registry.get_sample_value("policies:test_level", {"tenant": "gold"}) == 0
    assert registry.get_sample_value("policies:test_level", {"tenant": "free"}) == 4


def test_a_declared_series_without_labels_reads_zero_before_it_is_set():
    metrics, registry = make()
    metrics.declare(Series("policies:test_gauge", "A gauge"),
                    Series("policies:test_count", "A counter", counter=True))
    metrics.declare(Series("policies:test_gauge", "A gauge"))  # once per name
    assert registry.get_sample_value("policies:test_gauge") == 0
    assert registry.get_sample_value("policies:test_count_total") == 0
