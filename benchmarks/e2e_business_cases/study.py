"""Replay the business workload through every system and summarise it phase by phase.

The summary is plain JSON data::

    {"config": {...},
     "phases": [{"name": ..., "start_s": ..., "end_s": ...,
                 "systems": {"fcfs": M, "priority": M, "pipeline": M, "pipeline+fixes": M}},
                ...],
     "series": {"hit_rate": {system: [[t_s, rate], ...]},
                "switch_tenant_hit_rate": {system: [[t_s, rate], ...]}},
     "targets": [...]}

with ``M`` the output of `phase_metrics.phase_metrics` and ``targets`` that of
`targets.evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from benchmarks.e2e_business_cases.phase_metrics import hit_rate_series, run_phases
from benchmarks.e2e_business_cases.systems import SYSTEMS, build_system
from benchmarks.e2e_business_cases.targets import evaluate
from benchmarks.e2e_business_cases.workload import BusinessWorkload
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.metrics import DEFAULT_SLOS, SLO
from integrations.vllm_v1.instruments.harness import EngineShape

SHAPE = EngineShape(num_blocks=24800, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=8192, max_model_len=32768)
"""Llama-3-8B bf16 on one 80 GB GPU: the replay CLI's default engine."""
HIT_RATE_BIN_S = 10.0


def run_study(workload: BusinessWorkload, *, systems: Sequence[str] = SYSTEMS,
              shape: EngineShape = SHAPE, cost_model: StepCostModel | None = None,
              slos: Mapping[str, SLO] = DEFAULT_SLOS,
              progress: Callable[[str], Callable[[int], None]] | None = None) -> dict:
    """Replay ``workload`` through each of ``systems``; the summary in the module docstring.

    Every system replays the same trace on its own fresh harness, so systems do
    not share state. ``progress(system)`` returns a callback told of each
    admitted arrival.
    """
    cost_model = cost_model or StepCostModel.preset("h100")
    per_system, hit_rate, switch_hit_rate = {}, {}, {}
    for system in systems:
        run = replay(workload.trace, system, shape=shape, cost_model=cost_model,
                     harness=build_system(system, shape),
                     progress=progress(system) if progress else None)
        per_system[system] = run_phases(run, workload, slos)
        hit_rate[system] = hit_rate_series(run.records, bin_s=HIT_RATE_BIN_S)
        switch_hit_rate[system] = hit_rate_series(run.records, bin_s=HIT_RATE_BIN_S,
                                                  tenant=workload.switch_tenant)
    phases = [{"name": phase.name, "start_s": i * workload.phase_s,
               "end_s": (i + 1) * workload.phase_s,
               "systems": {system: per_system[system][i] for system in systems}}
              for i, phase in enumerate(workload.phases)]
    summary = {
        "config": {"requests": len(workload.trace.requests), "phase_s": workload.phase_s,
                   "switch_tenant": workload.switch_tenant, "switch_s": workload.switch_s,
                   "tenants": {t.name: attrs.asdict(t) for t in workload.tenants},
                   "weights": workload.weights,
                   "slos": {k: attrs.asdict(v) for k, v in slos.items()},
                   "engine": attrs.asdict(shape), "cost_model": attrs.asdict(cost_model)},
        "phases": phases,
        "series": {"hit_rate": hit_rate, "switch_tenant_hit_rate": switch_hit_rate},
    }
    summary["targets"] = evaluate(summary)
    return summary
