"""Test and replay instruments, not product API: the scheduler harness (a real vLLM
scheduler driven with no model), the step log and hold hooks, the tiny model.

Benchmarks reach vLLM only through `integrations.vllm_v1.instruments.harness`.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "SchedulerHarness": "integrations.vllm_v1.instruments.harness",
    "EngineShape": "integrations.vllm_v1.instruments.harness",
    "tiny_model_dir": "integrations.vllm_v1.instruments.tiny_model",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
