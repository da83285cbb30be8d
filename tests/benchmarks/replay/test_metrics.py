"""`latency_summary`'s admitted attainment: cancels on time and late, rejections."""

import pytest

from benchmarks.replay.metrics import DEFAULT_SLOS, latency_summary
from benchmarks.replay.records import RequestRecord


def _record(name: str, outcome: str, first_token_s: float | None, finish_s: float,
            tokens: int = 4) -> RequestRecord:
    record = RequestRecord(request_id=name, arrival_s=0.0, prompt_tokens=10, output_tokens=tokens,
                           tenant="t", priority=0, slo_class="short")
    if first_token_s is not None:
        record.token_times_s.extend(first_token_s + 0.01 * i for i in range(tokens))
    record.finish(outcome, finish_s)
    return record


def test_on_time_cancels_are_counted_and_left_out_of_the_uncancelled_attainment():
    records = [
        _record("met", "completed", 0.1, 0.2),
        _record("late", "completed", 0.9, 1.0),             # TTFT past the 0.5 s target
        _record("cancelled-early", "cancelled", None, 0.2),   # before its target: on time
        _record("cancelled-late", "cancelled", None, 0.8),    # no token by 0.8 s: late
        _record("rejected", "rejected", None, 0.0),
    ]
    summary = latency_summary(records, DEFAULT_SLOS, duration_s=1.0)
    assert summary["cancelled"] == 2 and summary["cancelled_on_time"] == 1
    assert summary["admitted_slo_attainment"] == pytest.approx(1 / 4)
    assert summary["admitted_slo_attainment_uncancelled"] == pytest.approx(1 / 3)
