"""Which `SchedulerHook`\\ s a scheduler runs: one per set pipeline slot that names a hook,
one per config key that turns a feature on, plus any named in config.

A slot names its hook in its own `Pipeline` field metadata (`integrations.vllm_v1.pipeline.HOOK`);
the config keys are named in the composition root (`integrations.vllm_v1.composition`), which
sits above every feature package, serving and the instruments. Both are imported by name when
a scheduler is built, so `scheduling` imports no feature package (the package order in
``tests/test_layering.py``, which resolves these names and checks where they point).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.pipeline import hooked_slots

COMPOSITION_ROOT = "integrations.vllm_v1.composition"
"""The module whose ``KEY_HOOKS`` maps config keys to hooks (``key -> package.module:factory``)."""


def feature_hooks(scheduler: SchedulerAccess) -> list[SchedulerHook]:
    """The hooks of ``scheduler.pipeline``'s set slots (field order; a factory that returns
    None adds none), then of its config entry's keys, then those the entry's ``hooks`` names
    (each factory once)."""
    pipeline = scheduler.pipeline
    hooks = [named_hook(path)(scheduler, getattr(pipeline, slot)) for slot, path in hooked_slots()
             if getattr(pipeline, slot) is not None]
    entry = config_entry(scheduler.vllm_config.additional_config)
    key_hooks = importlib.import_module(COMPOSITION_ROOT).KEY_HOOKS
    paths = [path for key, path in key_hooks if entry.get(key) is not None]
    paths += list(entry.get("hooks") or ())
    return [hook for hook in hooks if hook is not None] + [
        named_hook(path)(scheduler) for path in dict.fromkeys(paths)]


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
