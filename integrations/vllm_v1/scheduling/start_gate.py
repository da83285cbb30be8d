"""`StartGateHook`: the pipeline's ``start_gate`` (PD decode role) as a `SchedulerHook`.

Seam: vLLM's waiting pass stops starting requests once ``len(self.running)``
reaches the scheduler's ``max_num_active_reqs``. Before each step the gate is asked
how many leading waiting requests may start (`DecodeKVGate.startable`,
`DecodeStepGate.startable`) and the
scheduler's limit is lowered to the running count plus that
(`PolicyScheduler.limit_starts`). Requests already holding KV blocks
(``kv_holding_waiting``, e.g. remote KV loaded) are drained first by vLLM and need
no new blocks.

Metrics, with a gate that has ``stats()`` (`DecodeStepGate`):
``policies:decode_step_bound_seconds`` (the predicted step time starts may not push the
batch past; absent while the step model warms up) and
``policies:start_gate_held_by_step_total`` (steps in which the step bound, not KV or the
queue, stopped the starts).
"""

from __future__ import annotations

from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.metrics import PolicyMetrics, Series
from policies import DecodeStepGateStats
from policies.pd.scheduling import StartGate

MAX_LOOKAHEAD_REQUESTS = 64
"""Waiting requests the gate looks at per step (more never start in one step anyway)."""

STEP_BOUND = Series("policies:decode_step_bound_seconds",
                    "The predicted decode step time the start gate holds the batch within")
HELD_BY_STEP = Series("policies:start_gate_held_by_step", "Steps in which the start gate's "
                      "step bound stopped waiting requests from starting", counter=True)


def report_start_gate(metrics: PolicyMetrics, stats: DecodeStepGateStats) -> None:
    """Set the gate's step bound and advance its held counter to the gate's total."""
    metrics.declare(STEP_BOUND, HELD_BY_STEP)
    if stats.step_bound_s is not None:
        metrics.set(STEP_BOUND, stats.step_bound_s)
    metrics.count_to(HELD_BY_STEP, stats.held_by_step)


class StartGateHook(SchedulerHook):
    """Holds waiting requests back while starting them would push the batch past the gate's
    bound (KV usage, predicted step time)."""

    def __init__(self, scheduler: SchedulerAccess, gate: StartGate) -> None:
        self.scheduler = scheduler
        self.gate = gate

    def before_schedule(self, now: float) -> None:
        scheduler = self.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        needed = [0] * len(scheduler.kv_holding_waiting) + [
            -(-request.num_tokens // scheduler.block_size)
            for request in scheduler.waiting.head(MAX_LOOKAHEAD_REQUESTS)]
        scheduler.limit_starts(self.gate.startable(
            needed, used_blocks=pool.num_gpu_blocks - pool.get_num_free_blocks(),
            total_blocks=pool.num_gpu_blocks, running_requests=len(scheduler.running),
            block_size_tokens=scheduler.block_size))

    def refresh_metrics(self, metrics: PolicyMetrics) -> None:
        stats = getattr(self.gate, "stats", None)
        if stats is not None:
            report_start_gate(metrics, stats())
