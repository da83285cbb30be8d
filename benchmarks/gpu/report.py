"""Measured step times against the cost model, as a markdown table.

``python -m benchmarks.gpu.report --step-log DIR/step_log.jsonl --preset h200
--fitted DIR/cost_model.json --out DIR/report.md``
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.replay.calibrate import load_cost_model, samples_from_step_log
from benchmarks.replay.cost_model import StepBatch, StepCostModel
from integrations.vllm_v1.instruments.step_log import read_step_log


def describe(batch: StepBatch) -> str:
    """``prefill 512 (+2048 cached)``, ``64 decodes @ 2048`` or both."""
    parts = [f"prefill {c.tokens}" + (f" (+{c.cached_tokens} cached)" if c.cached_tokens else "")
             for c in batch.prefills]
    contexts = batch.decode_context_tokens
    if contexts:
        parts.append(f"{len(contexts)} decodes @ {round(statistics.fmean(contexts))}")
    return " + ".join(parts)


def report(step_log: Path, preset: str, fitted: StepCostModel) -> str:
    """One row per timed step: measured, preset and fitted milliseconds and errors."""
    base = StepCostModel.preset(preset)
    rows = [f"| step | measured ms | {preset} preset ms | error | fitted ms | error |",
            "|---|---:|---:|---:|---:|---:|"]
    errors: dict[str, list[float]] = {"preset": [], "fitted": []}
    for batch, seconds in samples_from_step_log(read_step_log(step_log)):
        cells = [describe(batch), f"{seconds * 1e3:.2f}"]
        for name, model in (("preset", base), ("fitted", fitted)):
            predicted = model.step_time_s(batch)
            error = (predicted - seconds) / seconds
            errors[name].append(abs(error))
            cells += [f"{predicted * 1e3:.2f}", f"{error:+.1%}"]
        rows.append("| " + " | ".join(cells) + " |")
    rows.append(f"| **median absolute error** | | | "
                f"{statistics.median(errors['preset']):.1%} | | "
                f"{statistics.median(errors['fitted']):.1%} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description="measured steps vs the cost model")
    parser.add_argument("--step-log", type=Path, required=True)
    parser.add_argument("--preset", default="h200")
    parser.add_argument("--fitted", type=Path, required=True, help="cost_model.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    text = report(args.step_log, args.preset, load_cost_model(args.fitted))
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
