"""`HoldHook`: while a file exists, no waiting request starts (a test instrument).

Tests that need a queue to build up before the engine serves it (fairness order,
overload) create the file, send their requests, and remove it: the queue then
drains in the pipeline's order. Named in the configuration:
``{"hooks": [HOLD_HOOK], "hold_path": PATH}``.
"""

from __future__ import annotations

import os

from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook

HOLD_HOOK = "integrations.vllm_v1.instruments.hold:HoldHook"


class HoldHook(SchedulerHook):
    """Starts no waiting request while the config's ``hold_path`` exists."""

    def __init__(self, scheduler: SchedulerAccess) -> None:
        self.scheduler = scheduler
        self.path = config_entry(scheduler.vllm_config.additional_config).get("hold_path")
        if not self.path:
            raise ValueError(f"{CONFIG_KEY}.hold_path must name the hold file for HoldHook")

    def before_schedule(self, now: float) -> None:
        if os.path.exists(self.path):
            self.scheduler.limit_starts(0)
