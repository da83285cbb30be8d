"""Run `policies` inside a real, unmodified vLLM V1 engine.

``Pipeline(...)`` composes policies; ``pipeline.llm(...)`` returns a
``vllm.LLM`` whose scheduler runs them, ``pipeline.serve(...)`` starts vLLM's
OpenAI server with them. Importing this package imports vLLM lazily: only the
names that need it load it.
"""

from importlib import import_module
from typing import Any

from integrations.vllm_v1.pipeline import Pipeline

_LAZY = {
    "PolicyScheduler": "integrations.vllm_v1.scheduling.scheduler",
    "AsyncPolicyScheduler": "integrations.vllm_v1.scheduling.scheduler",
    "PolicyRequestQueue": "integrations.vllm_v1.scheduling.queue",
    "PolicyFreeBlockQueue": "integrations.vllm_v1.cache.eviction",
    "install_eviction": "integrations.vllm_v1.cache.eviction",
    "SchedulerHarness": "integrations.vllm_v1.instruments.harness",
    "EngineShape": "integrations.vllm_v1.instruments.harness",
    "tiny_model_dir": "integrations.vllm_v1.instruments.tiny_model",
    "KVTierConfig": "integrations.vllm_v1.cache.tiers.config",
    "KVTierConnector": "integrations.vllm_v1.cache.tiers.connector",
    "LocalServer": "integrations.vllm_v1.serving.server",
    "resolve_pipeline": "integrations.vllm_v1.config.presets",
    "PRESETS": "integrations.vllm_v1.config.presets",
}

__all__ = ["Pipeline", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
