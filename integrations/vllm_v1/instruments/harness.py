"""Drive a real vLLM scheduler with no model: the test harness and replay core.

`SchedulerHarness` builds vLLM's own `Scheduler` (stock ``fcfs``/``priority``)
or our `PolicyScheduler` from a local ``config.json``, a `KVCacheConfig` and
vLLM's block hasher, then steps it with fake model outputs: every request whose
prefill is complete samples one token per step. Time is a `ManualClock`, so a
replay can run in virtual time.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import torch

from integrations.vllm_v1.config.spec import to_additional_config
from integrations.vllm_v1.pipeline import Pipeline
from integrations.vllm_v1.scheduling.scheduler import PolicyScheduler, PolicySchedulerMixin
from integrations.vllm_v1.slo.step_timing import scheduled_chunks
from integrations.vllm_v1.vllm_surface.names import (
    CacheConfig,
    EngineCoreOutput,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    ModelConfig,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StructuredOutputManager,
    VllmConfig,
    get_request_block_hasher,
    init_none_hash,
    sha256_cbor,
)
from policies import ManualClock

SAMPLED_TOKEN_ID = 7
"""The token every fake model step samples (requests run with ``ignore_eos``)."""
STOP_TOKEN_ID = 8
"""The token the fake model samples last for a request given ``output_tokens`` (a stop token
of that request's, so vLLM finishes it as a model that answered would)."""

_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def scheduler_model_dir(max_model_len: int) -> Path:
    """A cached directory holding only a Llama ``config.json`` (no weights, no tokenizer)."""
    root = Path(os.environ.get("LLM_SERVING_POLICIES_CACHE", Path.home() / ".cache" /
                               "llm-serving-policies"))
    path = root / f"scheduler-config-{max_model_len}"
    if not (path / "config.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=path.parent))
        config = {**_LLAMA_CONFIG, "max_position_embeddings": max_model_len}
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        try:
            staging.rename(path)
        except OSError:  # another process won the race
            (staging / "config.json").unlink()
            staging.rmdir()
    return path


@attrs.frozen(kw_only=True)
class EngineShape:
    """The scheduler-relevant shape of one engine."""

    num_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    """vLLM's ``--long-prefill-token-threshold``: the most prefill tokens a long prompt is
    scheduled per step beside other requests (0: no cap)."""
    long_prefill_token_threshold_adaptive: bool = False
    """vLLM's ``--long-prefill-token-threshold-adaptive``: the cap is at least the token
    budget's fair share among the queued and running requests."""


@attrs.frozen
class ScheduledWork:
    """What one scheduled step computes: prefill chunks and decoding sequences."""

    prefills: tuple[tuple[int, int], ...]
    """``(new_tokens, tokens_already_in_kv)`` per prefill chunk."""
    decode_contexts: tuple[int, ...]
    """Context length (tokens already in KV) of each decoding sequence."""


def scheduled_work(scheduler: Scheduler, num_scheduled_tokens: dict[str, int]) -> ScheduledWork:
    """Classify a step's scheduled tokens (`scheduled_chunks`); call between ``schedule()``
    and ``update_from_output()``."""
    return ScheduledWork(*scheduled_chunks(scheduler, num_scheduled_tokens))


@attrs.frozen
class StepResult:
    """What one harness step scheduled and what the engine reported back."""

    scheduler_output: SchedulerOutput
    outputs: tuple[EngineCoreOutput, ...]
    finished_request_ids: tuple[str, ...]


def build_scheduler(shape: EngineShape, pipeline: Pipeline | None,
                    stock_policy: Literal["fcfs", "priority"] = "fcfs",
                    scheduler_cls: type[Scheduler] | None = None,
                    entry: dict[str, Any] | None = None) -> Scheduler:
    """vLLM's stock `Scheduler` (``pipeline=None``) or a `PolicyScheduler`, with no model.

    ``stock_policy`` is vLLM's ``--scheduling-policy`` (a `PolicyScheduler` refuses
    ``priority`` unless the pipeline is the identity); ``scheduler_cls`` overrides the
    class (e.g. `AsyncPolicyScheduler`); ``entry``: further keys of our config entry
    (e.g. ``hooks``).
    """
    model_config = ModelConfig(
        model=str(scheduler_model_dir(shape.max_model_len)),
        skip_tokenizer_init=True,
        max_model_len=shape.max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=shape.long_prefill_token_threshold_adaptive,
        policy=stock_policy,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=shape.block_size,
                               enable_prefix_caching=shape.enable_prefix_caching)
    cache_config.num_gpu_blocks = shape.num_blocks
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        additional_config=(to_additional_config(pipeline, **(entry or {}))
                           if pipeline is not None else {}),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=shape.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer.0"],
                FullAttentionSpec(block_size=shape.block_size, num_kv_heads=1, head_size=64,
                                  dtype=torch.float32),
            )
        ],
    )
    cls = scheduler_cls or (PolicyScheduler if pipeline is not None else Scheduler)
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=shape.block_size,
        log_stats=True,
    )


@attrs.define(eq=False)
class SchedulerHarness:
    """A real vLLM scheduler, a virtual clock and a fake model that samples one token per step."""

    scheduler: Scheduler
    clock: ManualClock = attrs.field(factory=ManualClock)
    _block_hasher: object = attrs.field(init=False, repr=False)
    _output_tokens: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    """Request id -> the output length at which the fake model stops it."""

    def __attrs_post_init__(self) -> None:
        init_none_hash(sha256_cbor)
        self._block_hasher = get_request_block_hasher(self.scheduler.block_size, sha256_cbor)
        if isinstance(self.scheduler, PolicySchedulerMixin):
            self.scheduler.clock = self.clock.now

    @classmethod
    def build(cls, pipeline: Pipeline | None = None, *, shape: EngineShape | None = None,
              stock_policy: Literal["fcfs", "priority"] = "fcfs",
              scheduler_cls: type[Scheduler] | None = None,
              entry: dict[str, Any] | None = None) -> SchedulerHarness:
        """Harness over ``PolicyScheduler(pipeline)``, or stock vLLM when ``pipeline`` is None."""
        return cls(build_scheduler(shape or EngineShape(), pipeline, stock_policy,
                                   scheduler_cls, entry))

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int, *,
                    priority: int = 0, extra_args: dict | None = None,
                    arrival_s: float | None = None, session_id: str | None = None,
                    output_tokens: int | None = None) -> Request:
        """Submit a request that arrives now (or at ``arrival_s``) and runs ``max_tokens`` steps,
        or, given ``output_tokens`` below that, stops after that many (the last a stop token):
        the scheduler then sees only the client's ``max_tokens``, not the answer's length
        (``session_id``: vLLM's session field, the agent session it is a call of)."""
        stops = output_tokens is not None and output_tokens < max_tokens
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args,
                                stop_token_ids=[STOP_TOKEN_ID] if stops else None)
        if stops:
            self._output_tokens[request_id] = max(output_tokens, 1)
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=self.clock.now() if arrival_s is None else arrival_s,
            priority=priority,
            block_hasher=self._block_hasher,
            session_id=session_id,
        )
        self.scheduler.add_request(request)
        return request

    def step(self) -> StepResult:
        """One ``schedule()`` → fake model output → ``update_from_output()`` round."""
        return self.complete(self.scheduler.schedule())

    def complete(self, scheduler_output: SchedulerOutput) -> StepResult:
        """Feed the fake model's output for ``scheduler_output`` back to the scheduler."""
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            request = self.scheduler.requests[req_id]
            done_prefill = request.num_computed_tokens >= request.num_tokens
            last = request.num_output_tokens + 1 >= self._output_tokens.get(req_id, math.inf)
            sampled.append([STOP_TOKEN_ID if last else SAMPLED_TOKEN_ID] if done_prefill else [])
        model_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        engine_outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        outputs = tuple(out for batch in engine_outputs.values() for out in batch.outputs)
        finished = tuple(out.request_id for out in outputs if out.finish_reason is not None)
        for req_id in finished:
            self._output_tokens.pop(req_id, None)
        return StepResult(scheduler_output, outputs, finished)

    def tokens_left(self, request: Request) -> int:
        """Output tokens ``request`` will still generate (by ``max_tokens`` or its
        ``output_tokens``), within the context window."""
        stop = min(request.max_tokens, self._output_tokens.get(request.request_id, math.inf))
        return min(stop - request.num_output_tokens,
                   self.scheduler.max_model_len - request.num_tokens)

    def has_requests(self) -> bool:
        """Whether anything is still waiting, running or about to be reported."""
        return self.scheduler.has_requests()

    def abort(self, request_id: str) -> None:
        """The client cancelled ``request_id`` (as vLLM's engine finishes an aborted request)."""
        self._output_tokens.pop(request_id, None)
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def cached_blocks(self, block_hashes: Sequence[object]) -> int:
        """Leading blocks of ``block_hashes`` (vLLM block hashes) in the prefix cache."""
        pool = self.scheduler.kv_cache_manager.block_pool
        for count, block_hash in enumerate(block_hashes):
            if pool.get_cached_block(block_hash, [0]) is None:
                return count
        return len(block_hashes)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds when full."""
        return self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks * self.scheduler.block_size
