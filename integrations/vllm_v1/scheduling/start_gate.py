"""`GatedPolicyScheduler`: `PolicyScheduler` plus the pipeline's ``start_gate`` (PD decode role).

Seam: vLLM's waiting pass stops starting requests once ``len(self.running)``
reaches ``self.max_num_active_reqs`` (our own instance attribute). Before each
step the gate is asked how many leading waiting requests may start
(`DecodeKVGate.startable`) and the limit is set to the running count plus that,
never above the configured ``max_num_active_seqs``. Requests already holding KV
blocks (``kv_holding_waiting``, e.g. remote KV loaded) are drained first by vLLM
and need no new blocks. `Pipeline.engine_kwargs` picks this class when
``start_gate`` is set.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from integrations.vllm_v1.scheduling.scheduler import PolicySchedulerMixin

MAX_LOOKAHEAD_REQUESTS = 64
"""Waiting requests the gate looks at per step (more never start in one step anyway)."""


class StartGateMixin(PolicySchedulerMixin):
    """Applies ``pipeline.start_gate`` to vLLM's admission into the running set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._configured_active_limit = self.max_num_active_reqs

    def schedule(self, throttle_prefills: bool = False) -> Any:
        gate = self.pipeline.start_gate
        if gate is not None:
            pool = self.kv_cache_manager.block_pool
            needed = [0] * len(self.kv_holding_waiting) + [
                -(-request.num_tokens // self.block_size)
                for request in self.waiting.head(MAX_LOOKAHEAD_REQUESTS)]
            startable = gate.startable(
                needed, used_blocks=pool.num_gpu_blocks - pool.get_num_free_blocks(),
                total_blocks=pool.num_gpu_blocks, running_requests=len(self.running))
            self.max_num_active_reqs = min(self._configured_active_limit,
                                           len(self.running) + startable)
        return super().schedule(throttle_prefills)


class GatedPolicyScheduler(StartGateMixin, Scheduler):
    """vLLM's synchronous `Scheduler` running a `Pipeline` with a start gate."""


class AsyncGatedPolicyScheduler(StartGateMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` running a `Pipeline` with a start gate (GPU default)."""
