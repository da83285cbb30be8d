"""How fast the ``slo`` preset's online step-time model learns the engine, in the replay.

    python -m benchmarks.replay.step_model_convergence --trace azure-conv --rate-scale 4 \\
        --gpu h100 --max-requests 2000 --out out/step_model

Replays the trace through ``pipeline:slo`` and, every ``--every-s`` seconds of virtual time,
reads the engine's `OnlineStepTimeModel` as ``/metrics`` would: its out-of-sample relative
error (p50, p99 over its recent steps), its coefficients and the steps it has seen. The
replay's clock is advanced by the cost model, so the model is learning the cost model's
steps from the conservative prior, exactly as it learns a GPU's steps live. Writes
``OUT/convergence.json`` and ``OUT/convergence.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import attrs
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.replay.cli import add_engine_shape_arguments, engine_shape  # noqa: E402
from benchmarks.replay.cost_model import StepCostModel  # noqa: E402
from benchmarks.replay.datasets import assign_servegen_tenants  # noqa: E402
from benchmarks.replay.driver import build_harness, replay  # noqa: E402
from benchmarks.replay.workloads import load_workload  # noqa: E402


def sample(harness, points: list[dict], every_s: float) -> None:
    """Append the model's state to ``points`` if ``every_s`` has passed since the last one."""
    now = harness.clock.now()
    if points and now - points[-1]["time_s"] < every_s:
        return
    stats = harness.scheduler.pipeline.step_model.stats()
    points.append({"time_s": now, "observations": stats.observations,
                   "relative_error_p50": stats.relative_error_p50,
                   "relative_error_p99": stats.relative_error_p99,
                   "coefficients": attrs.asdict(stats.model)})


def plot(points: list[dict], path: Path, title: str) -> None:
    """Relative error p50 and p99 against time (log scale): ``points`` with ``time_s`` and
    ``relative_error_p50`` / ``relative_error_p99``, from a replay or a live ``/metrics``."""
    shown = [p for p in points if p["relative_error_p50"] is not None]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, label in (("relative_error_p50", "p50"), ("relative_error_p99", "p99")):
        ax.plot([p["time_s"] for p in shown], [p[key] for p in shown], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("|predicted - measured| / measured")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--tenants", choices=["none", "servegen"], default="servegen")
    parser.add_argument("--rate-scale", type=float, default=4.0)
    parser.add_argument("--max-requests", type=int, default=2000)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--every-s", type=float, default=5.0)
    add_engine_shape_arguments(parser, max_model_len=32768)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    trace = load_workload(args.trace, max_requests=args.max_requests)
    if args.tenants == "servegen":
        trace = assign_servegen_tenants(trace)
    trace = trace.scaled(args.rate_scale)
    shape, cost_model = engine_shape(args), StepCostModel.preset(args.gpu)
    harness = build_harness("pipeline:slo", shape)
    points: list[dict] = []
    replay(trace, "pipeline:slo", shape=shape, cost_model=cost_model, harness=harness,
           progress=lambda _n: sample(harness, points, args.every_s))
    sample(harness, points, 0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"trace": trace.name, "rate_scale": args.rate_scale, "gpu": args.gpu,
              "requests": len(trace.requests), "points": points}
    (args.out / "convergence.json").write_text(json.dumps(result, indent=2))
    plot(points, args.out / "convergence.png",
         f"online step model, {trace.name} x{args.rate_scale:g}, {args.gpu} cost model")
    first = next((p for p in points if p["relative_error_p50"] is not None), None)
    last = points[-1]
    print(f"steps seen {last['observations']}; relative error p50/p99 first "
          f"{first and first['relative_error_p50']:.3f}/{first and first['relative_error_p99']:.3f}"
          f" at {first and first['time_s']:.0f} s, last {last['relative_error_p50']:.3f}/"
          f"{last['relative_error_p99']:.3f} at {last['time_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
