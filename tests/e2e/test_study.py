"""A tiny end-to-end business-case study: summary schema, conservation, report and plots."""

import json

import pytest

from benchmarks.e2e_business_cases.__main__ import main
from benchmarks.e2e_business_cases.plots import FIGURES
from benchmarks.e2e_business_cases.systems import SYSTEMS, build_system
from benchmarks.e2e_business_cases.workload import PHASES, business_workload
from integrations.vllm_v1.instruments.harness import EngineShape

METRIC_KEYS = {
    "gold_short_ttft_p99_s", "short_ttft_p99_s", "ttft_p99_s_by_tier", "slo_attainment_by_tier",
    "goodput_rps", "jain_index", "fair_share_jain", "prefix_hit_rate", "offered", "admitted", "rejected",
    "rejections_by_reason", "all_rejections_have_retry_after", "queue_len_max",
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("business_case")
    summary = main(["--phase-s", "2", "--out", str(out)])
    return out, summary


def test_the_summary_has_every_phase_system_and_metric(study):
    out, summary = study
    assert json.loads((out / "summary.json").read_text())["phases"] == summary["phases"]
    assert [p["name"] for p in summary["phases"]] == [p.name for p in PHASES]
    for phase in summary["phases"]:
        assert list(phase["systems"]) == list(SYSTEMS)
        for metrics in phase["systems"].values():
            assert set(metrics) >= METRIC_KEYS
            assert set(metrics["ttft_p99_s_by_tier"]) == {"gold", "silver", "bronze"}


def test_admitted_plus_rejected_is_offered_per_phase_and_system(study):
    _, summary = study
    offered = len(business_workload(phase_s=2.0).trace.requests)
    for system in SYSTEMS:
        phases = [p["systems"][system] for p in summary["phases"]]
        assert sum(m["offered"] for m in phases) == offered
        for m in phases:
            assert m["admitted"] + m["rejected"] == m["offered"]
            assert m["completed"] + m["cancelled"] == m["admitted"]
            assert sum(m["rejections_by_reason"].values()) == m["rejected"]


def test_targets_report_and_figures_are_written(study):
    out, summary = study
    assert {(t["target"], t["system"]) for t in summary["targets"]} == {
        (t, s) for s in ("pipeline", "pipeline+fixes")
        for t in ("gold_short_ttft", "short_ttft_halved", "jain", "overload_conservation",
                  "hit_rate_recovery")}
    report = (out / "report.md").read_text()
    assert all(p.name in report for p in PHASES)
    assert all((out / name).stat().st_size > 0 for name in FIGURES)


def test_an_unknown_system_is_refused():
    with pytest.raises(ValueError, match="unknown system 'lifo': use one of fcfs, priority"):
        build_system("lifo", EngineShape())
