"""The composition root: the config keys that turn on a hook from above the scheduler.

A key in our config entry (``llm_serving_policies``) runs a hook from a package that sits
above `integrations.vllm_v1.scheduling` (serving, the test instruments): setting
``rejection_channel`` alone runs the rejection channel. The table lives here, above every
package it names (``tests/test_layering.py``), and the scheduler reads it by name
(`integrations.vllm_v1.scheduling.features.COMPOSITION_ROOT`). Slots name their hooks in
their own `Pipeline` field metadata instead.
"""

from __future__ import annotations

KEY_HOOKS: tuple[tuple[str, str], ...] = (
    ("rejection_channel", "integrations.vllm_v1.serving.rejection_channel:RejectionChannelHook"),
    ("step_log", "integrations.vllm_v1.instruments.step_log:StepLogHook"),
    ("hold_path", "integrations.vllm_v1.instruments.hold:HoldHook"),
)
"""Config entry key -> the hook it turns on (``package.module:factory``, called with the
scheduler)."""
