"""``--skip-requests``: a later window of a trace, starting at time 0, tenants as in the whole."""

import pytest

from benchmarks.replay.__main__ import skip_requests, with_tenant_priorities
from benchmarks.replay.datasets import assign_servegen_tenants
from benchmarks.replay.workloads import load_workload


def test_window_starts_at_zero_and_keeps_tenants_and_gaps():
    whole = with_tenant_priorities(assign_servegen_tenants(
        load_workload("azure-conv", max_requests=300), seed=0))
    window = skip_requests(whole, 200)
    assert len(window.requests) == 100
    assert window.requests[0].arrival_s == 0.0
    for kept, original in zip(window.requests, whole.requests[200:], strict=True):
        assert kept.request_id == original.request_id
        assert (kept.tenant, kept.priority) == (original.tenant, original.priority)
        assert kept.arrival_s == pytest.approx(original.arrival_s - whole.requests[200].arrival_s)
    assert skip_requests(whole, 0) is whole
    with pytest.raises(SystemExit, match="leaves no request"):
        skip_requests(whole, 300)


def test_cli_counts_max_requests_after_the_skipped(tmp_path):
    from benchmarks.replay.__main__ import main

    summary = main(["--trace", "azure-code", "--skip-requests", "50", "--max-requests", "40",
                    "--systems", "fcfs", "--kv-blocks", "4000", "--out", str(tmp_path)])
    assert summary["config"]["requests"] == 40 and summary["config"]["skip_requests"] == 50
    assert summary["systems"]["fcfs"]["overall"]["completed"] == 40
