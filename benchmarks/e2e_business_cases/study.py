"""Replay the business workload through every system and summarise it phase by phase.

The summary is plain JSON data::

    {"config": {...},
     "headline": "pipeline+slo",
     "slo_definitions": {"tier": {slo_class: {"ttft_s", "tpot_s"}}, "kind": {...}},
     "phases": [{"name": ..., "start_s": ..., "end_s": ...,
                 "systems": {"fcfs": M, "priority": M, "stock+queue-caps": M, ...}},
                ...],
     "queue_caps_sweep": {"settings": [...], "best": ..., "criterion": ...},
     "series": {"hit_rate": {system: [[t_s, rate], ...]},
                "switch_tenant_hit_rate": {system: [[t_s, rate], ...]}},
     "targets": [...]}

with ``M`` the output of `phase_metrics.phase_metrics` (SLO figures under the primary
definition, ``slos.PRIMARY``, and under each definition in ``M["by_definition"]``) and
``targets`` that of `targets.evaluate`. ``stock+queue-caps`` is the best setting of the
sweep (`queue_caps_sweep`), which replays every setting of
`benchmarks.replay.systems.QUEUE_CAPS_SWEEP`; ``headline`` names the system the README
leads with (`systems.HEADLINE`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor

import attrs

from benchmarks.e2e_business_cases.phase_metrics import hit_rate_series, run_phases
from benchmarks.e2e_business_cases.slos import DEFINITIONS, PRIMARY
from benchmarks.e2e_business_cases.systems import HEADLINE, SYSTEMS, build_system
from benchmarks.e2e_business_cases.targets import evaluate
from benchmarks.e2e_business_cases.workload import BusinessWorkload
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import SLO, latency_summary
from benchmarks.replay.records import MaxTokens, SystemRun
from benchmarks.replay.systems import (
    QUEUE_CAPS,
    QUEUE_CAPS_SWEEP,
    QueueCaps,
    best_queue_caps,
    expand_systems,
)
from integrations.vllm_v1.instruments.harness import EngineShape

SHAPE = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192, max_model_len=32768)
"""Llama-3-8B bf16 on one 80 GB GPU: the replay CLI's default engine."""
HIT_RATE_BIN_S = 10.0


def queue_caps_sweep(runs: Mapping[str, SystemRun], phases: Mapping[str, list[dict]],
                     workload: BusinessWorkload, slos: Mapping[str, SLO]) -> dict:
    """One row per `QUEUE_CAPS_SWEEP` setting and the best: the highest goodput over the whole
    run (SLO-meeting requests per second of the five phases), then the highest share of
    admitted requests meeting their SLO."""
    duration_s = len(workload.phases) * workload.phase_s
    rows = []
    for caps in QUEUE_CAPS_SWEEP:
        whole = latency_summary(runs[caps.name].records, slos, duration_s)
        last = phases[caps.name][-1]
        rows.append({
            "setting": caps.name, **attrs.asdict(caps),
            "goodput_rps": whole["goodput_rps"],
            "admitted_slo_attainment": whole["admitted_slo_attainment"],
            "rejected": whole["rejected"],
            "overload_goodput_rps": last["goodput_rps"],
            "overload_admitted_slo_attainment": last["admitted_slo_attainment"],
            "gold_short_ttft_p99_s_worst_phase": max(
                (m["gold_short_ttft_p99_s"] for m in phases[caps.name]
                 if m["gold_short_ttft_p99_s"] is not None), default=None),
        })
    best = best_queue_caps({r["setting"]: (r["goodput_rps"], r["admitted_slo_attainment"])
                            for r in rows})
    return {"settings": rows, "best": best,
            "criterion": "goodput_rps over the whole run, then admitted_slo_attainment"}


def replay_system(workload: BusinessWorkload, system: str, shape: EngineShape,
                  cost_model: StepCostModel,
                  progress: Callable[[int], None] | None = None,
                  max_tokens: MaxTokens = "output") -> SystemRun:
    """``workload`` replayed through ``system`` on its own fresh harness, the clients sending
    ``max_tokens`` (`benchmarks.replay.driver.replay`)."""
    return replay(workload.trace, system, shape=shape, cost_model=cost_model,
                  harness=build_system(system, shape), progress=progress,
                  max_tokens=max_tokens)


def replay_systems(workload: BusinessWorkload, systems: Sequence[str], *,
                   shape: EngineShape, cost_model: StepCostModel, jobs: int = 1,
                   progress: Callable[[str], Callable[[int], None]] | None = None,
                   max_tokens: MaxTokens = "output") -> dict[str, SystemRun]:
    """Each of ``systems`` replayed (`replay_system`), ``jobs`` at a time in worker processes.

    The runs do not depend on ``jobs``: every system replays the same trace on its own
    harness in virtual time. ``progress(system)`` returns a callback told of each admitted
    arrival (in this process: with ``jobs > 1`` it is told of a system's arrivals at once,
    when its replay ends).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}")
    if jobs == 1 or len(systems) == 1:
        return {system: replay_system(workload, system, shape, cost_model,
                                      progress(system) if progress else None, max_tokens)
                for system in systems}
    with ProcessPoolExecutor(max_workers=min(jobs, len(systems)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {system: pool.submit(replay_system, workload, system, shape, cost_model,
                                       None, max_tokens)
                   for system in systems}
        runs = {}
        for system, future in futures.items():
            runs[system] = future.result()
            if progress:
                progress(system)(len(workload.trace.requests))
        return runs


def run_study(workload: BusinessWorkload, *, systems: Sequence[str] = SYSTEMS,
              shape: EngineShape = SHAPE, cost_model: StepCostModel | None = None,
              definitions: Mapping[str, Mapping[str, SLO]] = DEFINITIONS,
              primary: str = PRIMARY, jobs: int = 1,
              progress: Callable[[str], Callable[[int], None]] | None = None,
              max_tokens: MaxTokens = "output") -> dict:
    """Replay ``workload`` through each of ``systems``; the summary in the module docstring.

    Every system replays the same trace on its own fresh harness, so systems do
    not share state, and ``jobs`` of them run at once (`replay_systems`; the summary does not
    depend on it). ``progress(system)`` returns a callback told of admitted arrivals. SLO
    figures are judged under ``definitions[primary]`` (and under each definition in
    ``by_definition``). ``max_tokens``: what the clients send (`replay_system`).
    """
    cost_model = cost_model or StepCostModel.preset("h100")
    slos = definitions[primary]
    runs = replay_systems(workload, expand_systems(systems), shape=shape,
                          cost_model=cost_model, jobs=jobs, progress=progress,
                          max_tokens=max_tokens)
    per_system = {system: run_phases(run, workload, slos, definitions)
                  for system, run in runs.items()}
    sweep = None
    if QUEUE_CAPS in systems:
        sweep = queue_caps_sweep(runs, per_system, workload, slos)
        runs[QUEUE_CAPS], per_system[QUEUE_CAPS] = runs[sweep["best"]], per_system[sweep["best"]]
    shown = [s for s in systems if s in per_system]
    hit_rate = {s: hit_rate_series(runs[s].records, bin_s=HIT_RATE_BIN_S) for s in shown}
    switch_hit_rate = {s: hit_rate_series(runs[s].records, bin_s=HIT_RATE_BIN_S,
                                          tenant=workload.switch_tenant) for s in shown}
    phases = [{"name": phase.name, "start_s": i * workload.phase_s,
               "end_s": (i + 1) * workload.phase_s,
               "systems": {system: per_system[system][i] for system in shown}}
              for i, phase in enumerate(workload.phases)]
    summary = {
        "config": {"requests": len(workload.trace.requests), "phase_s": workload.phase_s,
                   "switch_tenant": workload.switch_tenant, "switch_s": workload.switch_s,
                   "tenants": {t.name: attrs.asdict(t) for t in workload.tenants},
                   "weights": workload.weights, "slo_definition": primary,
                   "slos": {k: attrs.asdict(v) for k, v in slos.items()},
                   "engine": attrs.asdict(shape), "cost_model": attrs.asdict(cost_model),
                   "max_tokens_mode": max_tokens},
        "headline": HEADLINE if HEADLINE in shown else shown[-1],
        "product_preset": {"system": HEADLINE, "preset": "slo",
                           "declaration": "systems.slo_spec (the SLO classes, Gold protected)"},
        "slo_definitions": {name: {k: attrs.asdict(v) for k, v in d.items()}
                            for name, d in definitions.items()},
        "phases": phases,
        "series": {"hit_rate": hit_rate, "switch_tenant_hit_rate": switch_hit_rate},
    }
    if sweep is not None:
        summary["queue_caps_sweep"] = sweep
        summary["config"]["queue_caps_setting"] = attrs.asdict(QueueCaps.parse(sweep["best"]))
    summary["targets"] = evaluate(summary)
    return summary
