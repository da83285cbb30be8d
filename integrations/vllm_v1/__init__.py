"""Run `policies` inside a real, unmodified vLLM V1 engine.

``Pipeline(...)`` composes policies (a pure value); ``build_llm(pipeline, ...)`` returns a
``vllm.LLM`` whose scheduler runs them, ``serve(pipeline, model)`` starts vLLM's
OpenAI server with them. Without any of this package's launchers, a pipeline is
named in plain vLLM flags (`integrations.vllm_v1.config.spec`):

    vllm serve MODEL --scheduler-cls integrations.vllm_v1.scheduling.scheduler.PolicyScheduler \\
        --additional-config '{"llm_serving_policies": {"pipeline": "default"}}'

Sub-packages by concern: ``scheduling`` (the scheduler and its hooks), ``cache``
(eviction, warming, tiers, offload policy), ``speculative``, ``pd``, ``serving``
(engine arguments, server, CLI, HTTP), ``config`` (presets, import paths,
declarative mappings), ``vllm_surface`` (every vLLM internal touched), and
``instruments`` (the scheduler harness, step log and tiny model used by tests and
replays; not product API). Importing this package imports vLLM lazily: only the
names that need it load it.
"""

from importlib import import_module
from typing import Any

from integrations.vllm_v1.pipeline import Pipeline

_LAZY = {
    "PolicyScheduler": "integrations.vllm_v1.scheduling.scheduler",
    "AsyncPolicyScheduler": "integrations.vllm_v1.scheduling.scheduler",
    "SchedulerHook": "integrations.vllm_v1.hooks",
    "engine_kwargs": "integrations.vllm_v1.serving.engine",
    "build_llm": "integrations.vllm_v1.serving.engine",
    "serve": "integrations.vllm_v1.serving.server",
    "LocalServer": "integrations.vllm_v1.serving.server",
    "serve_disaggregated": "integrations.vllm_v1.pd.launch",
    "resolve_pipeline": "integrations.vllm_v1.config.spec",
    "preset": "integrations.vllm_v1.config.presets",
    "PRESETS": "integrations.vllm_v1.config.presets",
}

__all__ = ["Pipeline", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
