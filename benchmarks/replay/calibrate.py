"""Fit the step-cost model to a live engine's timed steps.

``python -m benchmarks.replay.calibrate --out DIR [--model DIR] [--base h100]``
runs a sweep of prefill and decode batches through a live vLLM engine (by
default the embedded tiny model on CPU) with the step-logging scheduler, fits
`StepCostModel` to the measured step times, and writes ``DIR/cost_model.json``
(use it with ``python -m benchmarks.replay --cost-model DIR/cost_model.json``)
plus ``DIR/calibration.json`` with the fit's error before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import attrs

from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel, fit_cost_model


def samples_from_step_log(events: Sequence[dict]) -> list[tuple[StepBatch, float]]:
    """``(batch, measured seconds)`` for every timed step of a step log."""
    samples = []
    for event in events:
        if event["event"] == "step" and event["duration_s"] > 0:
            batch = StepBatch(prefills=tuple(PrefillChunk(tokens=c, cached_tokens=k)
                                             for c, k in event["prefills"]),
                              decode_context_tokens=tuple(event["decodes"]))
            samples.append((batch, event["duration_s"]))
    return samples


def relative_errors(model: StepCostModel, samples: Sequence[tuple[StepBatch, float]]
                    ) -> list[float]:
    """``|predicted - measured| / measured`` per sample."""
    return [abs(model.step_time_s(batch) - seconds) / seconds for batch, seconds in samples]


def calibrate(samples: Sequence[tuple[StepBatch, float]], base: StepCostModel) -> dict:
    """Fit ``base`` to ``samples``; the fitted model and its error before and after."""
    fitted = fit_cost_model(samples, base)
    before, after = relative_errors(base, samples), relative_errors(fitted, samples)
    return {"samples": len(samples), "cost_model": attrs.asdict(fitted),
            "median_rel_error_before": statistics.median(before),
            "median_rel_error_after": statistics.median(after),
            "mean_rel_error_after": statistics.fmean(after)}


def load_cost_model(path: str | Path) -> StepCostModel:
    """A `StepCostModel` saved by this module (``cost_model.json``)."""
    return StepCostModel(**json.loads(Path(path).read_text()))


def sweep_prompts(max_prompt_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts for single prefills of many sizes, and 16 short prompts to decode together."""
    sizes = [s for s in (16, 32, 64, 128, 256, 384) if s < max_prompt_tokens]
    prefills = [[(7 * i + j) % 4000 + 6 for j in range(n)] for i, n in enumerate(sizes)]
    decoders = [[(11 * i + j) % 4000 + 6 for j in range(24)] for i in range(16)]
    return prefills, decoders


def run_live_sweep(model: str, log_path: Path, engine_kwargs: dict) -> list[dict]:
    """Drive the sweep through a live engine with the step-logging scheduler; the log events."""
    from integrations.vllm_v1 import Pipeline
    from integrations.vllm_v1.instruments import LLM, SamplingParams
    from integrations.vllm_v1.instruments.step_log import read_step_log, step_log_engine_kwargs

    log_path.unlink(missing_ok=True)
    llm = LLM(**step_log_engine_kwargs(Pipeline(), log_path, model=model, **engine_kwargs))
    prefills, decoders = sweep_prompts(engine_kwargs.get("max_model_len", 512))
    for prompt in prefills:  # one prefill per step
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1),
                     use_tqdm=False)
    for batch in (1, 4, 16):  # decode batches of growing size
        llm.generate([{"prompt_token_ids": p} for p in decoders[:batch]],
                     SamplingParams(max_tokens=48, ignore_eos=True, temperature=0),
                     use_tqdm=False)
    del llm
    return read_step_log(log_path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="fit the step-cost model to a live engine")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", help="model directory (default: embedded tiny model, dummy)")
    parser.add_argument("--base", default="h100", help="preset the fit starts from")
    parser.add_argument("--step-log", type=Path, help="fit an existing step log instead")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step_log:
        from integrations.vllm_v1.instruments.step_log import read_step_log

        events = read_step_log(args.step_log)
    else:
        engine_kwargs = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True,
                         "kv_cache_memory_bytes": 64 << 20, "block_size": 32}
        model = args.model
        if model is None:
            from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

            model = str(tiny_model_dir("dummy"))
            engine_kwargs["load_format"] = "dummy"
        events = run_live_sweep(model, args.out / "step_log.jsonl", engine_kwargs)
    report = calibrate(samples_from_step_log(events), StepCostModel.preset(args.base))
    (args.out / "cost_model.json").write_text(json.dumps(report["cost_model"], indent=2))
    (args.out / "calibration.json").write_text(json.dumps(report, indent=2))
    print(f"{report['samples']} steps; median relative error {report['median_rel_error_before']:.1%}"
          f" ({args.base} preset) -> {report['median_rel_error_after']:.1%} (fitted)")
    return report


if __name__ == "__main__":
    main()
