"""The ``slo`` preset in vLLM's scheduler puts its admission and step model on `/metrics`."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from integrations.vllm_v1.config.slo import slo_pipeline
from integrations.vllm_v1.instruments.harness import EngineShape, SchedulerHarness
from integrations.vllm_v1.metrics import PolicyMetrics


def test_the_slo_preset_exports_headroom_tracked_requests_and_its_step_model():
    harness = SchedulerHarness.build(slo_pipeline(),
                                     shape=EngineShape(num_blocks=4096, block_size=16))
    registry = CollectorRegistry()
    harness.scheduler.metrics = PolicyMetrics(refresh_interval_s=0.0, registry=registry)
    for index in range(12):
        harness.add_request(f"r{index}", range(index * 300, index * 300 + 200), 8)
        harness.clock.advance(0.01)
    harness.step()
    admission = harness.scheduler.pipeline.admission
    assert registry.get_sample_value("policies:slo_admitted_tracked") == admission.stats().tracked
    assert admission.stats().tracked > 0
    while harness.has_requests():  # each step takes 20 ms of the engine's clock
        output = harness.scheduler.schedule()
        harness.clock.advance(0.02)
        harness.complete(output)
    stats = admission.stats()
    assert registry.get_sample_value("policies:slo_headroom") == stats.headroom
    assert stats.class_headrooms and all(
        registry.get_sample_value("policies:slo_class_headroom", {"slo_class": cls}) == value
        for cls, value in stats.class_headrooms.items())
    assert stats.class_late_shares and all(
        registry.get_sample_value("policies:slo_class_late_share", {"slo_class": cls}) == share
        for cls, share in stats.class_late_shares.items())
    assert registry.get_sample_value("policies:slo_ttft_error_p90") == stats.ttft_error_p90
    assert registry.get_sample_value("policies:slo_admitted_tracked") == 0
    assert registry.get_sample_value("policies:step_model_observations") > 0
    assert stats.path.ingress_samples == 12
    assert registry.get_sample_value("policies:slo_path_seconds",
                                     {"term": "ingress"}) == stats.path.ingress_s
    assert registry.get_sample_value("policies:slo_path_seconds", {"term": "egress"}) == 0.0
    assert registry.get_sample_value("policies:slo_path_client_reports_total") == 0
    assert registry.get_sample_value("policies:slo_tpot_headroom") == stats.tpot_headroom
    assert registry.get_sample_value("policies:slo_tpot_bound_seconds") == math.inf, (
        "nothing decodes once drained")
    assert registry.get_sample_value("policies:slo_tpot_error_p90") == 0.0, "no stream report"
    assert registry.get_sample_value("policies:slo_tpot_late_share") == 0.0, "no stream report"
