"""A tiny end-to-end business-case study: summary schema, conservation, report and plots."""

import json

import pytest

from benchmarks.e2e_business_cases.__main__ import main
from benchmarks.e2e_business_cases.plots import FIGURES
from benchmarks.e2e_business_cases.slos import DEFINITIONS
from benchmarks.e2e_business_cases.study import run_study
from benchmarks.e2e_business_cases.systems import HEADLINE, SYSTEMS, build_system
from benchmarks.e2e_business_cases.workload import PHASES, business_workload
from benchmarks.replay.systems import QUEUE_CAPS, QUEUE_CAPS_SWEEP
from integrations.vllm_v1.instruments.harness import EngineShape

METRIC_KEYS = {
    "gold_short_ttft_p99_s", "short_ttft_p99_s", "ttft_p99_s_by_tier", "slo_attainment_by_tier",
    "goodput_rps", "jain_index", "fair_share_jain", "prefix_hit_rate", "offered", "admitted", "rejected",
    "rejections_by_reason", "all_rejections_have_retry_after", "queue_len_max",
    "admitted_slo_attainment", "admitted_slo_attainment_uncancelled", "cancelled_on_time",
    "by_definition",
}


STUDY_TIMEOUT_S = 900
"""Per-test limit of a test that runs the study: the whole study in this process took 130 s
at load 15 on 2 cores (the fixture's setup); a run in worker processes pays, per worker, a
fresh import of vLLM and the stack (spawn: about 10 s of CPU against 0.5 s of replay), so on
a loaded machine the workers are starved for minutes."""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The whole study, in this process (``--jobs 1``: the schema, report and plots do not
    depend on jobs; `test_replaying_in_worker_processes_gives_the_same_summary` checks that)."""
    out = tmp_path_factory.mktemp("business_case")
    summary = main(["--phase-s", "2", "--jobs", "1", "--out", str(out)])
    return out, summary


@pytest.mark.slow
@pytest.mark.timeout(STUDY_TIMEOUT_S)
def test_the_summary_has_every_phase_system_and_metric(study):
    out, summary = study
    assert json.loads((out / "summary.json").read_text())["phases"] == summary["phases"]
    assert [p["name"] for p in summary["phases"]] == [p.name for p in PHASES]
    for phase in summary["phases"]:
        assert list(phase["systems"]) == list(SYSTEMS)
        for metrics in phase["systems"].values():
            assert set(metrics) >= METRIC_KEYS
            assert set(metrics["ttft_p99_s_by_tier"]) == {"gold", "silver", "bronze"}
            assert set(metrics["by_definition"]) == set(DEFINITIONS)
            # the primary definition's figures are the top-level ones
            assert metrics["by_definition"]["kind"]["goodput_rps"] == metrics["goodput_rps"]
    assert summary["headline"] == HEADLINE


@pytest.mark.slow
@pytest.mark.timeout(STUDY_TIMEOUT_S)
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


@pytest.mark.slow
@pytest.mark.timeout(STUDY_TIMEOUT_S)
def test_targets_report_and_figures_are_written(study):
    out, summary = study
    assert {(t["target"], t["system"]) for t in summary["targets"]} == {
        (t, s) for s in ("pipeline", "pipeline+fixes", "pipeline+slo")
        for t in ("gold_short_ttft", "short_ttft_halved", "jain", "overload_conservation",
                  "hit_rate_recovery", "overload_admitted_slo", "overload_goodput")}
    report = (out / "report.md").read_text()
    assert all(p.name in report for p in PHASES)
    assert "stock+queue-caps` sweep" in report and "SLO definitions" in report
    assert all((out / name).stat().st_size > 0 for name in FIGURES)


@pytest.mark.slow
@pytest.mark.timeout(STUDY_TIMEOUT_S)
def test_the_queue_caps_sweep_is_reported_and_its_best_is_the_stock_system(study):
    _, summary = study
    sweep = summary["queue_caps_sweep"]
    assert [row["setting"] for row in sweep["settings"]] == [c.name for c in QUEUE_CAPS_SWEEP]
    best = max(sweep["settings"], key=lambda r: (r["goodput_rps"],
                                                 r["admitted_slo_attainment"] or -1))
    assert sweep["best"] == best["setting"]
    last = summary["phases"][-1]["systems"][QUEUE_CAPS]
    assert last["goodput_rps"] == best["overload_goodput_rps"]


def test_an_unknown_system_is_refused():
    with pytest.raises(ValueError, match="unknown system 'lifo': use one of fcfs, priority, "
                                         "stock\\+queue-caps"):
        build_system("lifo", EngineShape())


@pytest.mark.slow
@pytest.mark.timeout(STUDY_TIMEOUT_S)
def test_replaying_in_worker_processes_gives_the_same_summary():
    workload = business_workload(phase_s=1.0)
    systems = ["fcfs", "pipeline+slo"]
    serial, parallel = (run_study(workload, systems=systems, jobs=jobs) for jobs in (1, 2))
    assert parallel["phases"] == serial["phases"]
    assert parallel["targets"] == serial["targets"]


def test_jobs_below_one_are_refused():
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        run_study(business_workload(phase_s=1.0), systems=["fcfs"], jobs=0)
