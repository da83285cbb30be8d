"""How waiting and running requests are ordered, admitted, rate-capped and accounted.

`PolicyScheduler` (and `AsyncPolicyScheduler`) is vLLM's own scheduler steered by
a `Pipeline`; optional features plug into it as `SchedulerHook`\\ s
(`integrations.vllm_v1.hooks`). Name it in vLLM's configuration with
`SCHEDULER_CLS` (or `ASYNC_SCHEDULER_CLS` under asynchronous scheduling).
"""

SCHEDULER_CLS = "integrations.vllm_v1.scheduling.scheduler.PolicyScheduler"
"""``--scheduler-cls`` for synchronous scheduling (CPU, or GPU with ``--no-async-scheduling``)."""
ASYNC_SCHEDULER_CLS = "integrations.vllm_v1.scheduling.scheduler.AsyncPolicyScheduler"
"""``--scheduler-cls`` under asynchronous scheduling (vLLM's GPU default)."""


def scheduler_cls(asynchronous: bool) -> str:
    """The scheduler class path for an engine that schedules asynchronously or not."""
    return ASYNC_SCHEDULER_CLS if asynchronous else SCHEDULER_CLS
