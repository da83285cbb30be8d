"""The GPU step profiler writes a step log the calibration fits; the shipped H200 fit holds."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu import profile_steps, report
from benchmarks.replay.calibrate import (
    calibrate,
    load_cost_model,
    relative_errors,
    samples_from_step_log,
)
from benchmarks.replay.cost_model import StepCostModel
from integrations.vllm_v1.instruments.step_log import read_step_log

H200 = Path(__file__).parents[3] / "benchmarks" / "gpu" / "results" / "h200"


def test_cpu_smoke_run_writes_a_step_log_calibration_reads(tmp_path):
    profile_steps.main(["--out", str(tmp_path), "--device", "cpu", "--small", "--repeats", "1"])
    samples = samples_from_step_log(read_step_log(tmp_path / "step_log.jsonl"))
    shapes = {(b.prefill_tokens, len(b.decode_context_tokens)) for b, _ in samples}
    assert shapes == {(64, 0), (32, 0), (0, 4), (16, 2)}
    assert all(seconds > 0 for _, seconds in samples)


def test_shipped_h200_fit_explains_both_measured_runs_better_than_the_preset():
    fitted = load_cost_model(H200 / "cost_model.json")
    preset = StepCostModel.preset("h200")
    for log in ("step_log.jsonl", "step_log_rerun.jsonl"):
        samples = samples_from_step_log(read_step_log(H200 / log))
        assert len(samples) == 35
        fitted_errors = sorted(relative_errors(fitted, samples))
        preset_errors = sorted(relative_errors(preset, samples))
        assert fitted_errors[len(samples) // 2] < 0.05 < preset_errors[len(samples) // 2]


def test_shipped_fit_and_report_are_regenerated_from_the_shipped_log():
    samples = samples_from_step_log(read_step_log(H200 / "step_log.jsonl"))
    refit = calibrate(samples, StepCostModel.preset("h200"))["cost_model"]
    shipped = load_cost_model(H200 / "cost_model.json")
    for name, value in refit.items():
        assert abs(value - getattr(shipped, name)) <= 1e-6 * abs(value), name
    text = report.report(H200 / "step_log.jsonl", "h200", shipped)
    assert text == (H200 / "report.md").read_text()
