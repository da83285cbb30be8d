"""The business case's targets judge a candidate against every stock system of the run."""

from benchmarks.e2e_business_cases.targets import evaluate

CAPS = "stock+queue-caps:priority:reqs=128"


def _metrics(goodput: float) -> dict:
    return {"gold_short_ttft_p99_s": 0.1, "short_ttft_p99_s": 0.2, "jain_index": 0.99,
            "switch_tenant_hit_rate": 0.5, "admitted_slo_attainment": 0.97,
            "admitted_slo_attainment_uncancelled": 0.97, "goodput_rps": goodput,
            "offered": 10, "admitted": 10, "rejected": 0, "rejections_with_retry_after": 0,
            "conserved": True, "all_rejections_have_retry_after": True}


def _summary(systems: dict[str, float]) -> dict:
    phase = {"systems": {name: _metrics(goodput) for name, goodput in systems.items()}}
    return {"config": {"slos": {"gold-chat": {"ttft_s": 0.5}}}, "phases": [phase] * 5}


def _goodput_target(summary: dict) -> dict:
    return next(t for t in evaluate(summary) if t["target"] == "overload_goodput")


def test_a_named_queue_caps_setting_is_a_stock_peer():
    target = _goodput_target(_summary({"fcfs": 24.5, CAPS: 33.3, "pipeline+slo": 32.7}))
    assert target["best_stock_systems"] == CAPS and target["best_stock"] == 33.3
    assert not target["passed"]


def test_the_candidate_passes_when_it_beats_every_stock_system():
    target = _goodput_target(_summary({"fcfs": 24.5, CAPS: 30.0, "pipeline+slo": 32.7}))
    assert target["passed"] and target["best_stock_systems"] == CAPS


def test_nothing_is_judged_without_a_stock_system():
    assert evaluate(_summary({"pipeline+slo": 32.7})) == []
