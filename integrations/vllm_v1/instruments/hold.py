"""`HoldHook`: while a file exists, no waiting request starts (a test instrument).

Tests that need a queue to build up before the engine serves it (fairness order,
overload) create the file, send their requests, and remove it: the queue then
drains in the pipeline's order. Named in the configuration:
``{"hooks": [HOLD_HOOK], "hold_path": PATH}``. With ``"hold_step_s": S`` every engine step
also waits ``S`` seconds first, so a test's timing holds on a machine of any speed (a stream of
``n`` tokens takes at least ``n * S`` seconds).
"""

from __future__ import annotations

import os
import time

from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook

HOLD_HOOK = "integrations.vllm_v1.instruments.hold:HoldHook"


class HoldHook(SchedulerHook):
    """Starts no waiting request while the config's ``hold_path`` exists; paces steps by the
    config's ``hold_step_s`` (default 0)."""

    def __init__(self, scheduler: SchedulerAccess) -> None:
        self.scheduler = scheduler
        entry = config_entry(scheduler.vllm_config.additional_config)
        self.path = entry.get("hold_path")
        if not self.path:
            raise ValueError(f"{CONFIG_KEY}.hold_path must name the hold file for HoldHook")
        self.step_s = entry.get("hold_step_s", 0.0)
        if not isinstance(self.step_s, (int, float)) or not 0 <= self.step_s < 10:
            raise ValueError(f"{CONFIG_KEY}.hold_step_s must be seconds in [0, 10), "
                             f"got {self.step_s!r}")

    def before_schedule(self, now: float) -> None:
        if self.step_s:
            time.sleep(self.step_s)
        if os.path.exists(self.path):
            self.scheduler.limit_starts(0)
