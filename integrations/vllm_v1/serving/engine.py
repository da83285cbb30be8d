"""Engine arguments that run a `Pipeline`, and a `vllm.LLM` built from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from integrations.vllm_v1.config.spec import CONFIG_KEY, to_additional_config
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.scheduling import scheduler_cls

if TYPE_CHECKING:
    from integrations.vllm_v1.vllm_surface.names import LLM


def engine_kwargs(pipeline: Pipeline, **engine_kwargs: Any) -> dict[str, Any]:
    """``engine_kwargs`` plus the scheduler class and ``additional_config`` carrying ``pipeline``.

    Picks `AsyncPolicyScheduler` when the engine will schedule asynchronously (GPU
    default), else `PolicyScheduler`. Keys already in ``additional_config``'s
    ``llm_serving_policies`` entry (e.g. ``hooks``) are kept.
    """
    if "scheduler_cls" in engine_kwargs:
        raise ValueError("scheduler_cls is set by the pipeline; do not pass it")
    additional = dict(engine_kwargs.pop("additional_config", None) or {})
    entry = {k: v for k, v in (additional.get(CONFIG_KEY) or {}).items() if k != "pipeline"}
    additional.update(to_additional_config(pipeline, **entry))
    return {**engine_kwargs, "scheduler_cls": scheduler_cls(_schedules_async(engine_kwargs)),
            "additional_config": additional}


def build_llm(pipeline: Pipeline, **kwargs: Any) -> LLM:
    """A ``vllm.LLM`` whose scheduler runs ``pipeline``."""
    from integrations.vllm_v1.vllm_surface.names import LLM

    return LLM(**engine_kwargs(pipeline, **kwargs))


def _schedules_async(kwargs: dict[str, Any]) -> bool:
    if kwargs.get("async_scheduling") is not None:
        return bool(kwargs["async_scheduling"])
    from integrations.vllm_v1.vllm_surface.names import platform_is_cpu

    return not platform_is_cpu() and kwargs.get("speculative_config") is None
