"""Test and replay instruments, not product API: the scheduler harness (a real vLLM
scheduler driven with no model), the step log and hold hooks, the tiny model.

Benchmarks reach vLLM only through this package: the harness, and vLLM's offline
engine (``LLM``, ``SamplingParams``) for the live benchmarks.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "SchedulerHarness": "integrations.vllm_v1.instruments.harness",
    "EngineShape": "integrations.vllm_v1.instruments.harness",
    "tiny_model_dir": "integrations.vllm_v1.instruments.tiny_model",
    "LLM": "integrations.vllm_v1.vllm_surface.names",
    "SamplingParams": "integrations.vllm_v1.vllm_surface.names",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
