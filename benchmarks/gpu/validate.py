"""The business case live on one GPU: stock vLLM vs the pipeline over HTTP, then a cost-model
fit from the live run's own steps.

``python -m benchmarks.gpu.validate --out DIR [--phase-s 24] [--systems fcfs,pipeline+fixes]``

Builds a Llama-3-8B-shaped model directory (32 layers, GQA 32/8, FFN 14,336, bf16, dummy
weights; the embedded 4,096-token tokenizer stands in for Llama-3's, so the vocabulary is
4,096 rather than 128,256), plays the five-phase business workload at the replay study's
rates and full token lengths through one OpenAI server per system (`live`), and writes:

- ``DIR/live_summary.json``, ``DIR/live_report.md``: per-phase metrics and targets, as the
  replay study's;
- ``DIR/step_logs/<system>.jsonl``: every step of the pipeline systems' engines;
- ``DIR/cost_model.json``, ``DIR/calibration.json``: `StepCostModel` fitted to those steps,
  starting from the ``--base`` preset (``h200``), with the median error before and after.

Every server schedules synchronously (the step log times each step), stock and pipeline
alike. ``benchmarks/gpu/validate_business_case.sh`` installs everything and runs this.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from benchmarks.e2e_business_cases.live import LIVE_SYSTEMS, LiveScale, run_live_study, write_live
from benchmarks.e2e_business_cases.report import console_table
from benchmarks.e2e_business_cases.systems import PIPELINES
from benchmarks.e2e_business_cases.workload import BASE_RATE_SCALE
from benchmarks.replay.calibrate import calibrate, samples_from_step_log
from benchmarks.replay.cost_model import StepCostModel
from integrations.vllm_v1.instruments.step_log import read_step_log
from integrations.vllm_v1.instruments.tiny_model import TinyModelSpec, tiny_model_dir

LLAMA3_8B_SHAPE = TinyModelSpec(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                                max_position_embeddings=32768)
"""Llama-3-8B's layers with the embedded tokenizer's 4,096-token vocabulary."""
GPU_SCALE = LiveScale(phase_s=24.0, rate_scale=BASE_RATE_SCALE, token_scale=1.0,
                      max_output_tokens=2048, max_model_len=32768, max_num_seqs=256,
                      max_num_batched_tokens=8192, dtype="bfloat16", enforce_eager=False)
"""The replay study's engine shape and rates, full lengths; 24 s phases (2 min per system)."""


def run_validation(out: Path, *, scale: LiveScale = GPU_SCALE, model: str | None = None,
                   systems: Sequence[str] = LIVE_SYSTEMS, base: str = "h200") -> dict:
    """Play the live study, write it, and fit the cost model to the pipeline systems' steps.

    Returns the study summary with ``calibration`` (the fit's report, or ``None`` without a
    pipeline system) added.
    """
    started = time.perf_counter()
    model = model or str(tiny_model_dir("dummy", spec=LLAMA3_8B_SHAPE))
    step_logs = out / "step_logs"
    summary = run_live_study(scale=scale, systems=systems, model=model, log_dir=out / "logs",
                             step_logs=step_logs,
                             progress=lambda s: print(f"live: {s} ...", flush=True))
    write_live(summary, out)
    samples = [sample for system in systems if system in PIPELINES
               for sample in samples_from_step_log(read_step_log(step_logs / f"{system}.jsonl"))]
    report = calibrate(samples, StepCostModel.preset(base)) if samples else None
    if report is not None:
        (out / "cost_model.json").write_text(json.dumps(report["cost_model"], indent=2))
        (out / "calibration.json").write_text(json.dumps(report, indent=2))
    summary["calibration"] = report
    print(console_table(summary))
    if report is not None:
        print(f"cost model: {report['samples']} live steps; median relative error "
              f"{report['median_rel_error_before']:.1%} ({base} preset) -> "
              f"{report['median_rel_error_after']:.1%} (fitted)")
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s")
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phase-s", type=float, default=GPU_SCALE.phase_s,
                        help="seconds per phase (five phases per system)")
    parser.add_argument("--systems", default=",".join(LIVE_SYSTEMS),
                        help="comma-separated systems, one server each")
    parser.add_argument("--base", default="h200", help="cost-model preset the fit starts from")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return run_validation(args.out, scale=attrs.evolve(GPU_SCALE, phase_s=args.phase_s),
                          systems=args.systems.split(","), base=args.base)


if __name__ == "__main__":
    main()
