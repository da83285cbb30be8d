"""A `PolicyScheduler` that logs every arrival and step of a live engine to JSONL.

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
scheduling only).

A test seam: with ``"hold_path": PATH`` in the config, no waiting request starts
while that file exists (vLLM's waiting pass stops at ``max_num_active_reqs``), so
arrivals queue, in the pipeline's order, until the file is removed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from vllm.v1.request import Request

from integrations.vllm_v1.instruments.harness import scheduled_work
from integrations.vllm_v1.pipeline import CONFIG_KEY, Pipeline
from integrations.vllm_v1.scheduling.scheduler import PolicyScheduler

STEP_LOG_SCHEDULER = "integrations.vllm_v1.instruments.step_log.StepLogScheduler"


def step_log_engine_kwargs(pipeline: Pipeline, path: str | Path, **engine_kwargs: Any
                           ) -> dict[str, Any]:
    """Engine kwargs that run ``pipeline`` and log the engine's steps to ``path``."""
    kwargs = pipeline.engine_kwargs(async_scheduling=False, **engine_kwargs)
    kwargs["scheduler_cls"] = STEP_LOG_SCHEDULER
    kwargs["additional_config"][CONFIG_KEY]["step_log"] = str(path)
    return kwargs


def step_log_server_args(pipeline: Pipeline, path: str | Path) -> tuple[str, ...]:
    """Extra OpenAI-server flags that run ``pipeline`` and log the engine's steps to ``path``
    (they override the scheduler class and config `Pipeline.serve` passes; needs
    ``--no-async-scheduling``)."""
    kwargs = step_log_engine_kwargs(pipeline, path)
    return ("--scheduler-cls", kwargs["scheduler_cls"],
            "--additional-config", json.dumps(kwargs["additional_config"]))


def read_step_log(path: str | Path) -> list[dict]:
    """The events of a step log, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


class StepLogScheduler(PolicyScheduler):
    """`PolicyScheduler` plus a JSONL log of arrivals and timed steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ours = self.vllm_config.additional_config[CONFIG_KEY]
        self._log = open(ours["step_log"], "a", buffering=1)  # noqa: SIM115 - engine's life
        self._hold_path = ours.get("hold_path")
        self._active_limit = self.max_num_active_reqs
        self._step = 0
        self._started: float | None = None
        config = self.scheduler_config
        self._write({"event": "config", "num_blocks": self.kv_cache_config.num_blocks,
                     "block_size": self.block_size, "max_num_seqs": config.max_num_seqs,
                     "max_num_batched_tokens": config.max_num_batched_tokens,
                     "max_model_len": self.max_model_len,
                     "long_prefill_token_threshold": config.long_prefill_token_threshold,
                     "enable_prefix_caching": self.cache_config.enable_prefix_caching})

    def _write(self, event: dict) -> None:
        self._log.write(json.dumps(event) + "\n")

    def add_request(self, request: Request) -> None:
        self._write({"event": "add", "step": self._step, "request_id": request.request_id,
                     "prompt_token_ids": list(request.prompt_token_ids or []),
                     "max_tokens": request.max_tokens, "priority": request.priority,
                     "extra_args": getattr(request.sampling_params, "extra_args", None) or {}})
        super().add_request(request)

    def schedule(self, throttle_prefills: bool = False) -> Any:
        if self._hold_path is not None:
            held = os.path.exists(self._hold_path)
            self.max_num_active_reqs = len(self.running) if held else self._active_limit
        output = super().schedule(throttle_prefills)
        self._scheduled = dict(output.num_scheduled_tokens)
        self._work = scheduled_work(self, self._scheduled)
        self._started = time.perf_counter()
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        duration = time.perf_counter() - self._started if self._started else 0.0
        if self._scheduled:
            self._write({"event": "step", "step": self._step, "scheduled": self._scheduled,
                         "prefills": self._work.prefills, "decodes": self._work.decode_contexts,
                         "duration_s": duration})
        self._step += 1
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        self._log.close()
        super().shutdown()
