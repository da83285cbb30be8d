"""`StepLogHook`: a JSONL log of every arrival and step of a live engine (a test instrument).

The log is enough to replay the engine's exact inputs through the scheduler
harness (fidelity checks) and to fit the replay's step-cost model to measured
step times (calibration). One line per event:

    {"event": "config", "num_blocks", "block_size", "max_num_seqs", ...}
    {"event": "add", "step", "request_id", "prompt_token_ids", "max_tokens", "priority",
     "extra_args"}
    {"event": "step", "step", "scheduled": {request_id: tokens}, "prefills": [[c, k]],
     "decodes": [ctx], "duration_s"}

``duration_s`` runs from the end of ``schedule()`` to the start of
``update_from_output()``: the model's forward pass and sampling (synchronous
scheduling only). The hook runs beside every other feature of the pipeline: it is
named in the configuration (``llm_serving_policies.hooks``), not a scheduler class.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from integrations.vllm_v1.config.spec import CONFIG_KEY, config_entry
from integrations.vllm_v1.hooks import SchedulerAccess, SchedulerHook
from integrations.vllm_v1.instruments.harness import scheduled_work
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.serving.engine import engine_kwargs

STEP_LOG_HOOK = "integrations.vllm_v1.instruments.step_log:StepLogHook"


def step_log_engine_kwargs(pipeline: Pipeline, path: str | Path, *, hooks: tuple[str, ...] = (),
                           entry: dict[str, Any] | None = None, **kwargs: Any
                           ) -> dict[str, Any]:
    """Engine kwargs that run ``pipeline`` and log the engine's steps to ``path`` (plus any
    further ``hooks`` and ``entry`` keys of our config entry)."""
    config = {CONFIG_KEY: {**(entry or {}), "hooks": [STEP_LOG_HOOK, *hooks],
                           "step_log": str(path)}}
    return engine_kwargs(pipeline, async_scheduling=False, additional_config=config, **kwargs)


def step_log_server_args(pipeline: Pipeline, path: str | Path, **options: Any
                         ) -> tuple[str, ...]:
    """OpenAI-server flags that run ``pipeline`` and log the engine's steps to ``path``
    (``options`` as for `step_log_engine_kwargs`)."""
    kwargs = step_log_engine_kwargs(pipeline, path, **options)
    return ("--scheduler-cls", kwargs["scheduler_cls"], "--no-async-scheduling",
            "--additional-config", json.dumps(kwargs["additional_config"]))


def read_step_log(path: str | Path) -> list[dict]:
    """The events of a step log, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


class StepLogHook(SchedulerHook):
    """Writes the arrivals and timed steps of ``scheduler`` to the config's ``step_log`` path."""

    def __init__(self, scheduler: SchedulerAccess) -> None:
        self.scheduler = scheduler
        path = config_entry(scheduler.vllm_config.additional_config).get("step_log")
        if not path:
            raise ValueError(f"{CONFIG_KEY}.step_log must name the log file for StepLogHook")
        self._log = open(path, "a", buffering=1)  # noqa: SIM115 - the engine's life
        self._step = 0
        self._started: float | None = None
        self._scheduled: dict[str, int] = {}
        config = scheduler.scheduler_config
        self._write({"event": "config", "num_blocks": scheduler.kv_cache_config.num_blocks,
                     "block_size": scheduler.block_size, "max_num_seqs": config.max_num_seqs,
                     "max_num_batched_tokens": config.max_num_batched_tokens,
                     "max_model_len": scheduler.max_model_len,
                     "long_prefill_token_threshold": config.long_prefill_token_threshold,
                     "enable_prefix_caching": scheduler.cache_config.enable_prefix_caching})

    def _write(self, event: dict) -> None:
        self._log.write(json.dumps(event) + "\n")

    def on_arrival(self, request: Any) -> None:
        self._write({"event": "add", "step": self._step, "request_id": request.request_id,
                     "prompt_token_ids": list(request.prompt_token_ids or []),
                     "max_tokens": request.max_tokens, "priority": request.priority,
                     "extra_args": getattr(request.sampling_params, "extra_args", None) or {}})

    def after_schedule(self, scheduler_output: Any) -> None:
        self._scheduled = dict(scheduler_output.num_scheduled_tokens)
        self._work = scheduled_work(self.scheduler, self._scheduled)
        self._started = time.perf_counter()

    def before_update(self, scheduler_output: Any, model_runner_output: Any) -> None:
        duration = time.perf_counter() - self._started if self._started else 0.0
        if self._scheduled:
            self._write({"event": "step", "step": self._step, "scheduled": self._scheduled,
                         "prefills": self._work.prefills, "decodes": self._work.decode_contexts,
                         "duration_s": duration})
        self._step += 1

    def shutdown(self, now: float) -> None:
        self._log.close()
