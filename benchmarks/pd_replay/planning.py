"""``--plan``: the P:D split `PDPlanner` picks, replayed per window against colocation.

The trace is cut into windows of ``window_s`` seconds of arrivals. Window 0 is
planned from its own requests (the history a deployment is sized from, with no
prefix-cache hits assumed); every later window is planned from what the replay of
the one before observed (each request's prompt, cached and output tokens), with
the planner's hysteresis relative to the split in place. Each window is replayed
as its own cluster (caches start empty, a window's requests drain in it), and so
are the colocated baseline (least-loaded routing over all instances, vLLM's stock
scheduling) and, with ``static_splits``, every fixed split: all systems see the
same windows. Records of all windows are then summarised together: goodput under
the replay's default SLOs and under the ITL-bounded SLO (`benchmarks.pd_replay.goodput`).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import matplotlib.pyplot as plt
import numpy as np

from benchmarks.pd_replay.capacity import StepCostCapacity
from benchmarks.pd_replay.cluster import ClusterRun
from benchmarks.pd_replay.setup import SCHEDULING, ReplaySetup, format_table, row
from benchmarks.replay.records import SystemRun
from benchmarks.replay.trace import Trace
from policies.pd.planner import PDPlan, PDPlanner


def windows(trace: Trace, window_s: float) -> list[Trace]:
    """The trace cut by arrival into consecutive windows of ``window_s`` (empty ones dropped)."""
    start = trace.requests[0].arrival_s
    cuts: dict[int, list] = {}
    for request in trace.requests:
        cuts.setdefault(int((request.arrival_s - start) // window_s), []).append(request)
    return [attrs.evolve(trace, requests=tuple(cuts[k])) for k in sorted(cuts)]


def capacity_model(setup: ReplaySetup, scheduling: str, itl_slo_s: float | None,
                   history: Trace) -> StepCostCapacity:
    """Per-instance capacity of this setup's engines under ``scheduling``.

    Decode steps batch sequences of the mean context of ``history`` (the sizing window).
    """
    shape = setup.shape
    prefill_role, decode_role = SCHEDULING[scheduling]
    gate = decode_role.pipeline.start_gate if decode_role.pipeline is not None else None
    contexts = [r.prompt_tokens + r.output_tokens // 2 for r in history.requests]
    return StepCostCapacity(
        batch_context_tokens=max(1, round(sum(contexts) / len(contexts))),
        cost_model=setup.cost_model, kv_capacity_tokens=shape.num_blocks * shape.block_size,
        prefill_chunk_tokens=(prefill_role.max_num_batched_tokens
                              or shape.max_num_batched_tokens),
        colocated_chunk_tokens=shape.max_num_batched_tokens,
        decode_kv_fraction=gate.max_kv_usage if gate is not None else 1.0,
        max_num_seqs=shape.max_num_seqs, itl_target_s=itl_slo_s)


def combine(runs: list[ClusterRun], system: str) -> ClusterRun:
    """The windows' runs of one system as one run (records and counters added up)."""
    records = tuple(r for run in runs for r in run.run.records)
    busy: dict[str, float] = {}
    for run in runs:
        for name, seconds in run.busy_s_by_instance.items():
            busy[name] = busy.get(name, 0.0) + seconds
    return ClusterRun(
        system=system,
        run=SystemRun(system=system, records=records, steps=sum(r.run.steps for r in runs),
                      busy_s=sum(r.run.busy_s for r in runs),
                      makespan_s=max(r.run.makespan_s for r in runs),
                      preemptions=sum(r.run.preemptions for r in runs),
                      wall_s=sum(r.run.wall_s for r in runs)),
        kv_bytes_transferred=sum(r.kv_bytes_transferred for r in runs),
        kv_bytes_full_prompts=sum(r.kv_bytes_full_prompts for r in runs),
        transfers=sum(r.transfers for r in runs), skipped_prefill=sum(r.skipped_prefill
                                                                       for r in runs),
        busy_s_by_instance=busy)


def _replay(setup: ReplaySetup, window: Trace, plan: PDPlan, router: str, scheduling: str,
            label: str) -> ClusterRun:
    if plan.colocated:
        names = [f"colocated{i}" for i in range(plan.decode)]
        return setup.run(window, plan.name, setup.router("least_loaded", [], names), [], names,
                         "stock", label=label)
    prefill = [f"prefill{i}" for i in range(plan.prefill)]
    decode = [f"decode{i}" for i in range(plan.decode)]
    return setup.run(window, plan.name, setup.router(router, prefill, decode), prefill, decode,
                     scheduling, label=label)


def run_planning(trace: Trace, setup: ReplaySetup, *, instances: int, window_s: float,
                 router: str, scheduling: str, itl_slo_s: float | None, static_splits: bool,
                 out: Path) -> dict:
    """Plan and replay every window; the summary (rows, per-window plans) and ``plan.png``."""
    parts = windows(trace, window_s)
    if setup.bar is not None:
        setup.bar.reset(total=len(trace.requests) * (2 + static_splits * (instances - 1)))
    capacity = capacity_model(setup, scheduling, itl_slo_s, parts[0])
    sizing = PDPlanner(instances=instances, capacity=capacity, itl_slo_s=itl_slo_s,
                       window_s=window_s)
    sizing.observe_all((r.arrival_s, r.prompt_tokens, 0, r.output_tokens)
                       for r in parts[0].requests)
    planner = PDPlanner(instances=instances, capacity=capacity, itl_slo_s=itl_slo_s,
                        window_s=window_s, initial_plan=sizing.plan(parts[0].requests[-1]
                                                                    .arrival_s))
    colocated = PDPlan(prefill=0, decode=instances)
    replays: dict[tuple[int, PDPlan], ClusterRun] = {}

    def replay(k: int, plan: PDPlan, label: str) -> ClusterRun:
        """Window ``k`` under ``plan`` (each pair replayed once: the replay is deterministic)."""
        if (k, plan) not in replays:
            replays[k, plan] = _replay(setup, parts[k], plan, router, scheduling, label)
        elif setup.bar is not None:
            setup.bar.update(len(parts[k].requests))
        return replays[k, plan]

    planned_runs, colocated_runs, plans = [], [], []
    for k, window in enumerate(parts):
        start = window.requests[0].arrival_s
        plan = planner.plan(start) if k else planner.initial_plan
        demand = planner.demand(start) if k else sizing.demand(parts[0].requests[-1].arrival_s)
        planned = replay(k, plan, f"window {k} planned")
        for record in sorted(planned.run.records, key=lambda r: r.arrival_s):
            planner.observe(record.arrival_s, prompt_tokens=record.prompt_tokens,
                            output_tokens=record.output_tokens,
                            cached_tokens=min(record.cached_tokens, record.prompt_tokens))
        planned_runs.append(planned)
        colocated_runs.append(replay(k, colocated, f"window {k} colocated"))
        plans.append({"window": k, "start_s": start, "requests": len(window.requests),
                      "plan": plan.name, "demand": attrs.asdict(demand),
                      "utilization": {p.name: PDPlanner.utilization(p, demand)
                                      for p in planner.candidates()}})
    systems = {"planned": combine(planned_runs, "planned"),
               "colocated": combine(colocated_runs, "colocated")}
    if static_splits:
        for p in range(1, instances):
            split = PDPlan(prefill=p, decode=instances - p)
            systems[split.name] = combine([replay(k, split, f"static {split.name}")
                                           for k in range(len(parts))], split.name)
    rows = {name: row(run, name, setup.itl_slo_s) for name, run in systems.items()}
    summary = {
        "instances": instances, "window_s": window_s, "router": router,
        "scheduling": scheduling, "planned_for_itl_slo_s": itl_slo_s,
        "itl_slo_s": setup.itl_slo_s, "colocated_itl_s": capacity.colocated_itl_s(),
        "windows": plans, "planner": attrs.asdict(planner.stats(), recurse=False,
                                                  value_serializer=_plain),
        "rows": list(rows.values()),
        "goodput_ratio_itl": _ratio(rows["planned"]["goodput_itl_rps"],
                                    rows["colocated"]["goodput_itl_rps"]),
        "goodput_ratio_default": _ratio(rows["planned"]["goodput_rps"],
                                        rows["colocated"]["goodput_rps"]),
        "plot": "plan.png"}
    plot_plan(summary, out / "plan.png", trace.name)
    return summary


def _plain(_instance: object, _field: object, value: object) -> object:
    return value.name if isinstance(value, PDPlan) else value


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def plot_plan(summary: dict, path: Path, trace_name: str) -> None:
    """Goodput per system under both SLOs, and the planned split and demand per window."""
    fig, (bars, timeline) = plt.subplots(1, 2, figsize=(13, 3.8))
    names = [r["router"] for r in summary["rows"]]
    x = np.arange(len(names))
    bars.bar(x - 0.2, [r["goodput_rps"] or 0 for r in summary["rows"]], 0.4,
             label="default SLOs")
    bars.bar(x + 0.2, [r["goodput_itl_rps"] or 0 for r in summary["rows"]], 0.4,
             label=f"ITL-bounded (p99 gap <= {summary['itl_slo_s'] * 1000:.0f} ms)")
    bars.set_xticks(x, names)
    bars.set_ylabel("goodput (requests/s)")
    bars.legend(fontsize=8)
    bars.set_title(f"{trace_name}, {summary['instances']} instances")
    starts = [w["start_s"] for w in summary["windows"]]
    prefill = [int(w["plan"].split("P")[0]) if "P" in w["plan"] else 0
               for w in summary["windows"]]
    timeline.step(starts, prefill, where="post", label="planned prefill instances (0: colocated)")
    timeline.plot(starts, [w["demand"]["prefill_instances"] for w in summary["windows"]], "o--",
                  label="prefill work (instances)")
    timeline.plot(starts, [w["demand"]["decode_instances"] for w in summary["windows"]], "s--",
                  label="decode work (instances)")
    timeline.set_xlabel("window start (s)")
    timeline.legend(fontsize=8)
    timeline.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_plan(summary: dict) -> str:
    """The per-window plans and one line per system."""
    lines = [f"{summary['instances']} instances, windows of {summary['window_s']:.0f} s, "
             f"colocated gap {summary['colocated_itl_s'] * 1000:.0f} ms, ITL SLO "
             f"{summary['itl_slo_s'] * 1000:.0f} ms"]
    for w in summary["windows"]:
        d = w["demand"]
        lines.append(f"  window {w['window']}: {w['requests']} requests -> {w['plan']} "
                     f"(prefill {d['prefill_instances']:.2f}, decode {d['decode_instances']:.2f}"
                     f" instances of work)")
    lines.append(format_table(summary["rows"]))
    lines.append(f"planned / colocated goodput: ITL-bounded {summary['goodput_ratio_itl']}, "
                 f"default {summary['goodput_ratio_default']}")
    return "\n".join(lines)
