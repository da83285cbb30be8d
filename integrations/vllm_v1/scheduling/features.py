"""Which `SchedulerHook`\\ s a scheduler runs: one per set pipeline slot, one per config key
that turns a feature on, plus any named in config.

Adding a feature is one line here (slot or key -> the hook's import path) and its hook; the
scheduler itself does not change. Slots and keys name their hooks the same way, by
``package.module:factory`` imported when a scheduler is built, so `scheduling` imports no
feature package (the package order in ``tests/test_layering.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerHook

SLOT_HOOKS: tuple[tuple[str, str], ...] = (
    ("start_gate", "integrations.vllm_v1.scheduling.start_gate:StartGateHook"),
    ("eviction", "integrations.vllm_v1.cache.eviction:EvictionHook"),
    ("speculation", "integrations.vllm_v1.speculative.budget:DraftBudgetHook"),
    ("warming", "integrations.vllm_v1.cache.warming:CacheWarmingHook"),
    ("step_model", "integrations.vllm_v1.slo.step_timing:StepTimingHook"),
)
"""Pipeline slot -> the hook that runs it (``package.module:factory``, called as
``factory(scheduler, policy)``), in call order."""


KEY_HOOKS: tuple[tuple[str, str], ...] = (
    ("rejection_channel", "integrations.vllm_v1.serving.rejection_channel:RejectionChannelHook"),
    ("step_log", "integrations.vllm_v1.instruments.step_log:StepLogHook"),
    ("hold_path", "integrations.vllm_v1.instruments.hold:HoldHook"),
)
"""Config entry key -> the hook it turns on (``package.module:factory``, called with the
scheduler), so ``{"rejection_channel": ADDRESS}`` alone runs the rejection channel."""


def feature_hooks(scheduler: Any) -> list[SchedulerHook]:
    """The hooks of ``scheduler.pipeline``'s set slots, then of its config entry's keys, then
    those the entry's ``hooks`` names (each factory once)."""
    pipeline = scheduler.pipeline
    hooks = [named_hook(path)(scheduler, getattr(pipeline, slot)) for slot, path in SLOT_HOOKS
             if getattr(pipeline, slot) is not None]
    entry = config_entry(scheduler.vllm_config.additional_config)
    paths = [path for key, path in KEY_HOOKS if entry.get(key) is not None]
    paths += list(entry.get("hooks") or ())
    return hooks + [named_hook(path)(scheduler) for path in dict.fromkeys(paths)]


def named_hook(path: object) -> Callable[..., SchedulerHook]:
    """The hook factory ``path`` (``package.module:factory``) names, imported.

    Raises:
        PipelineConfigError: ``path`` is malformed or cannot be imported.
    """
    if not isinstance(path, str) or ":" not in path:
        raise PipelineConfigError(f"{CONFIG_KEY}.hooks: expected 'package.module:factory', "
                                  f"got {path!r}")
    module, attr = path.split(":", 1)
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise PipelineConfigError(f"{CONFIG_KEY}.hooks: cannot import {path!r} ({error})"
                                  ) from error
