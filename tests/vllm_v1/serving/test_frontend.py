"""The door's bookkeeping per request (`FrontendStage`, `Visit`), without a server."""

from types import SimpleNamespace

from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.serving.frontend import FrontendStage


class Gauge:
    def __init__(self, sets):
        self.sets = sets

    def set(self, _value):
        self.sets.append(1)

    def labels(self, **_labels):
        return self


def stage_with_gauges():
    sets = []
    stage = FrontendStage.from_spec(SLOSpec(), metrics=False)
    stage.metrics = SimpleNamespace(**{name: Gauge(sets) for name in (
        "in_stage", "rate", "limit", "in_flight")})
    return stage, sets


def admitted(stage):
    visit = stage.visit()
    visit.served = True
    visit.slo_class = stage.tightest
    assert stage.limits.acquire(visit.slo_class, visit.tenant).admitted
    visit.place = visit.slo_class
    return visit


def test_a_response_end_leaves_the_stage_and_its_place_and_sets_the_gauges_once():
    stage, sets = stage_with_gauges()
    visit = admitted(stage)
    assert (stage.gate.stats().in_stage, stage.limits.in_flight) == (1, 1)
    before = len(sets)
    visit.end()
    assert (stage.gate.stats().in_stage, stage.limits.in_flight) == (0, 0)
    refresh = 3 + len(stage.ttft_s)  # one refresh: three gauges and a limit per class
    assert len(sets) - before == refresh
    visit.end()
    assert len(sets) - before == refresh  # idempotent, nothing left to refresh


def test_a_request_that_left_the_stage_keeps_its_place_until_its_response_ends():
    stage, sets = stage_with_gauges()
    visit = admitted(stage)
    visit.leave()
    assert (stage.gate.stats().in_stage, stage.limits.in_flight) == (0, 1)
    before = len(sets)
    visit.end()
    assert stage.limits.in_flight == 0
    assert len(sets) - before == 3 + len(stage.ttft_s)
