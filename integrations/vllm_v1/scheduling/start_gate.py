"""`StartGateHook`: the pipeline's ``start_gate`` (PD decode role) as a `SchedulerHook`.

Seam: vLLM's waiting pass stops starting requests once ``len(self.running)``
reaches the scheduler's ``max_num_active_reqs``. Before each step the gate is asked
how many leading waiting requests may start (`DecodeKVGate.startable`,
`DecodeStepGate.startable`) and the
scheduler's limit is lowered to the running count plus that
(`PolicyScheduler.limit_starts`). Requests already holding KV blocks
(``kv_holding_waiting``, e.g. remote KV loaded) are drained first by vLLM and need
no new blocks.
"""

from __future__ import annotations

from typing import Any

from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from policies.pd_scheduling import StartGate

MAX_LOOKAHEAD_REQUESTS = 64
"""Waiting requests the gate looks at per step (more never start in one step anyway)."""


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

    def refresh_metrics(self, metrics: Any) -> None:
        stats = getattr(self.gate, "stats", None)
        if stats is not None:
            metrics.start_gate(stats())
