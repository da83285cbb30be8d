"""The vLLM names this project overrides, calls, assigns or reads, with the parameters
it expects: pure data, checked against vLLM's sources by `check` (no vLLM import).

``params`` lists the leading parameters after ``self``, in order; any further
parameter of the real function must have a default (we never pass it).
"""

from __future__ import annotations

from typing import NamedTuple

SCHED = "vllm.v1.core.sched.scheduler"
KV_UTILS = "vllm.v1.core.kv_cache_utils"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.base"


class Touch(NamedTuple):
    """One vLLM name the project depends on."""

    module: str
    """The module that defines it (or re-exports it, for package-level names)."""
    name: str
    """``Name`` or ``Class.member``."""
    use: str
    """``import``, ``subclass``, ``override``, ``call``, ``assign`` or ``read``."""
    params: tuple[str, ...] | None = None


def _members(module: str, cls: str, use: str, *members: str | tuple[str, tuple[str, ...]]
             ) -> list[Touch]:
    out = []
    for member in members:
        name, params = (member, None) if isinstance(member, str) else member
        out.append(Touch(module, f"{cls}.{name}", use, params))
    return out


TOUCHES: tuple[Touch, ...] = (
    # -- the scheduler (integrations.vllm_v1.scheduling) --------------------------
    Touch(SCHED, "Scheduler", "subclass"),
    Touch("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", "subclass"),
    *_members(SCHED, "Scheduler", "override",
              ("__init__", ("vllm_config", "kv_cache_config", "structured_output_manager",
                            "block_size")),
              ("add_request", ("request",)), ("has_requests", ()), ("shutdown", ()),
              ("schedule", ("throttle_prefills",)),
              ("update_from_output", ("scheduler_output", "model_runner_output")),
              ("_reserve_prefill_lookahead", ("request", "num_computed_tokens",
                                              "num_new_tokens")),
              ("_update_after_schedule", ("scheduler_output",)),
              ("_preempt_request", ("request", "timestamp", "drop_stale_output")),
              ("_free_request", ("request", "delay_free_blocks"))),
    *_members(SCHED, "Scheduler", "call", ("get_request_counts", ()), ("get_kv_cache_usage", ()),
              ("finish_requests", ("request_ids", "finished_status")),
              # slot preemption (``PolicyScheduler._preempt_for_waiting``)
              ("_preempt_request", ("request", "timestamp", "drop_stale_output")),
              ("_request_blocks_can_be_freed", ("request",))),
    *_members(SCHED, "Scheduler", "assign", "waiting", "kv_holding_waiting",
              "max_num_active_reqs"),
    *_members(SCHED, "Scheduler", "read", "vllm_config", "scheduler_config", "cache_config",
              "requests", "running", "kv_cache_manager", "kv_cache_config",
              "max_num_running_reqs", "max_num_scheduled_tokens", "block_size",
              "hash_block_size", "max_model_len", "connector", "prev_step_scheduled_req_ids"),
    Touch("vllm.v1.core.sched.request_queue", "RequestQueue", "subclass"),
    *_members("vllm.v1.core.sched.request_queue", "RequestQueue", "override",
              ("add_request", ("request",)), ("pop_request", ()), ("peek_request", ()),
              ("prepend_request", ("request",)), ("prepend_requests", ("requests",)),
              ("remove_request", ("request",)), ("remove_requests", ("requests",)),
              ("__bool__", ()), ("__len__", ()), ("__iter__", ())),
    Touch("vllm.v1.engine", "EngineCoreOutput", "call"),
    *_members("vllm.v1.engine", "EngineCoreOutput", "assign", "request_id", "new_token_ids",
              "finish_reason", "stop_reason"),
    Touch("vllm.v1.engine", "EngineCoreOutputs", "call"),
    Touch("vllm.v1.engine", "FinishReason", "read"),
    Touch("vllm.v1.request", "Request", "call",
          ("request_id", "prompt_token_ids", "sampling_params", "pooling_params")),
    *_members("vllm.v1.request", "Request", "read", "request_id", "priority", "arrival_time",
              "num_prompt_tokens", "num_computed_tokens", "num_tokens", "max_tokens",
              "block_hashes", "sampling_params", "client_index", "status", "prompt_token_ids",
              "session_id"),
    *_members("vllm.v1.request", "Request", "assign", "spec_token_ids"),
    *_members("vllm.config", "SchedulerConfig", "read", "policy", "max_num_seqs",
              "max_num_batched_tokens", "long_prefill_token_threshold"),
    *_members("vllm.config", "CacheConfig", "read", "prefix_caching_hash_algo",
              "enable_prefix_caching", "block_size"),
    Touch("vllm.v1.request", "RequestStatus", "read"),
    # -- KV cache (integrations.vllm_v1.cache) -------------------------------------
    Touch(KV_UTILS, "FreeKVCacheBlockQueue", "subclass"),
    *_members(KV_UTILS, "FreeKVCacheBlockQueue", "override",
              ("popleft", ()), ("popleft_n", ("n",)), ("remove", ("block",)),
              ("append", ("block",)), ("append_n", ("blocks",)), ("prepend_n", ("blocks",)),
              ("get_all_free_blocks", ()), ("iter_blocks_after", ("cursor",))),
    *_members(KV_UTILS, "FreeKVCacheBlockQueue", "assign", "num_free_blocks"),
    *_members(KV_UTILS, "KVCacheBlock", "read", "block_id", "ref_cnt", "block_hash",
              "block_hash_num_tokens"),
    *_members(KV_UTILS, "KVCacheBlock", "assign", "prev_free_block", "next_free_block"),
    Touch(KV_UTILS, "get_group_id", "call", ("key",)),
    Touch(KV_UTILS, "make_block_hash_with_group_id", "call", ("block_hash", "group_id")),
    Touch(KV_UTILS, "get_request_block_hasher", "call", ("hash_block_size", "caching_hash_fn")),
    Touch(KV_UTILS, "init_none_hash", "call", ("hash_fn",)),
    *_members("vllm.v1.core.block_pool", "BlockPool", "assign", "free_block_queue"),
    *_members("vllm.v1.core.block_pool", "BlockPool", "read", "num_gpu_blocks"),
    *_members("vllm.v1.core.block_pool", "BlockPool", "call", ("get_num_free_blocks", ()),
              ("get_cached_block", ("block_hash", "kv_cache_group_ids"))),
    *_members("vllm.v1.core.kv_cache_manager", "KVCacheManager", "read", "enable_caching",
              "coordinator", "block_pool", "usage"),
    *_members("vllm.v1.core.kv_cache_manager", "KVCacheManager", "call",
              ("prefix_cache_lookup_enabled", ("request",))),
    *_members("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator", "call",
              ("find_longest_cache_hit", ("block_hashes", "max_cache_hit_length"))),
    Touch("vllm.utils.hashing", "get_hash_fn_by_name", "call", ("hash_fn_name",)),
    Touch("vllm.utils.hashing", "sha256_cbor", "call"),
    # -- KV connector (integrations.vllm_v1.cache.tiers) -------------------------
    Touch(CONNECTOR, "KVConnectorBase_V1", "subclass"),
    *_members(CONNECTOR, "KVConnectorBase_V1", "override",
              ("__init__", ("vllm_config", "role", "kv_cache_config")),
              ("start_load_kv", ("forward_context",)), ("wait_for_layer_load", ("layer_name",)),
              ("save_kv_layer", ("layer_name", "kv_layer", "attn_metadata")),
              ("wait_for_save", ()),
              ("get_num_new_matched_tokens", ("request", "num_computed_tokens")),
              ("update_state_after_alloc", ("request", "blocks", "num_external_tokens")),
              ("build_connector_meta", ("scheduler_output",)),
              ("request_finished", ("request", "block_ids")),
              ("get_external_cache_hit_sources", ("request", "num_external_tokens")),
              ("get_kv_connector_stats", ()), ("build_kv_connector_stats", ("data",)),
              ("build_prom_metrics", ("vllm_config", "metric_types", "labelnames",
                                      "per_engine_labelvalues"))),
    *_members(CONNECTOR, "KVConnectorBase_V1", "read", "_kv_transfer_config"),
    Touch(CONNECTOR, "KVConnectorMetadata", "subclass"),
    Touch(CONNECTOR, "KVConnectorRole", "read"),
    Touch("vllm.distributed.kv_transfer.kv_connector.v1.metrics", "KVConnectorStats",
          "subclass"),
    Touch("vllm.distributed.kv_transfer.kv_connector.v1.metrics", "KVConnectorPromMetrics",
          "subclass"),
    Touch("vllm.v1.metrics.cache_hit_source", "CacheHitSource", "read"),
    Touch("vllm.distributed.parallel_state", "get_tensor_model_parallel_rank", "call", ()),
    # -- the offloading connector's CPU cache policy (integrations.vllm_v1.cache) --
    Touch("vllm.v1.kv_offload.cpu.policies.base", "CachePolicy", "subclass"),
    Touch("vllm.v1.kv_offload.cpu.policies.base", "ChunkStatus", "read"),
    Touch("vllm.v1.kv_offload.cpu.policies.base", "order_request_keys", "call"),
    Touch("vllm.v1.kv_offload.base", "OffloadKey", "read"),
    Touch("vllm.v1.kv_offload.base", "ReqContext", "read"),
    Touch("vllm.v1.kv_offload.base", "get_offload_group_idx", "call"),
    # -- the scheduler harness (integrations.vllm_v1.instruments) ----------------
    Touch("vllm.config", "VllmConfig", "call"),
    Touch("vllm.config", "ModelConfig", "call"),
    Touch("vllm.config", "CacheConfig", "call"),
    Touch("vllm.config", "SchedulerConfig", "call"),
    Touch("vllm.v1.kv_cache_interface", "FullAttentionSpec", "call"),
    Touch("vllm.v1.kv_cache_interface", "KVCacheConfig", "call"),
    Touch("vllm.v1.kv_cache_interface", "KVCacheGroupSpec", "call"),
    Touch("vllm.v1.outputs", "ModelRunnerOutput", "call"),
    Touch("vllm.v1.core.sched.output", "SchedulerOutput", "read"),
    Touch("vllm.v1.structured_output", "StructuredOutputManager", "call", ("vllm_config",)),
    Touch("vllm.sampling_params", "SamplingParams", "call"),
    Touch("vllm.platforms", "current_platform", "read"),
    # -- plugin registration (integrations.vllm_v1.plugin) ----------------------
    Touch("vllm.distributed.kv_transfer.kv_connector.factory",
          "KVConnectorFactory.register_connector", "call", ("name", "module_path", "class_name")),
    Touch("vllm.distributed.kv_transfer.kv_connector.factory", "KVConnectorFactory._registry",
          "read"),
    Touch("vllm.v1.kv_offload.cpu.policies.factory", "CachePolicyFactory.register_cache_policy",
          "call", ("name", "module_path", "class_name")),
    Touch("vllm.v1.kv_offload.cpu.policies.factory", "CachePolicyFactory._registry", "read"),
    Touch("vllm.v1.spec_decode.ngram_proposer",
          "_find_longest_matched_ngram_and_propose_tokens", "call",
          ("origin_tokens", "min_ngram", "max_ngram", "max_model_len", "k")),
)
"""Everything `integrations` touches inside vLLM."""


def overrides() -> dict[str, tuple[str, ...]]:
    """Class name -> the methods the project overrides on it."""
    out: dict[str, tuple[str, ...]] = {}
    for touch in TOUCHES:
        if touch.use == "override":
            cls, member = touch.name.split(".", 1)
            out[cls] = (*out.get(cls, ()), member)
    return out


OVERRIDES = overrides()


# -- Ray Serve engine replicas (integrations.ray_serve.engine) ------------------------
TOUCHES += (
    Touch("vllm.entrypoints.cli.serve", "make_arg_parser", "call", ("parser",)),
    Touch("vllm.entrypoints.cli.serve", "validate_parsed_serve_args", "call", ("args",)),
    Touch("vllm.utils.argparse_utils", "FlexibleArgumentParser", "call"),
    Touch("vllm.engine.arg_utils", "AsyncEngineArgs.from_cli_args", "call", ("args",)),
    Touch("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", "call", ("engine_args",)),
    *_members("vllm.v1.engine.async_llm", "AsyncLLM", "call",
              ("get_supported_tasks", ()), ("check_health", ()), ("shutdown", ())),
    *_members("vllm.v1.engine.async_llm", "AsyncLLM", "read", "model_config"),
    Touch("vllm.entrypoints.launchers.app", "build_app",
          "call", ("args", "supported_tasks", "model_config")),
    Touch("vllm.entrypoints.launchers.api_server.app_state", "init_app_state", "call",
          ("engine_client", "state", "args", "supported_tasks")),
    # the drain's end: every request in flight aborted (integrations.vllm_v1.serving.drain)
    Touch("vllm.v1.engine.async_llm", "AsyncLLM.pause_generation", "call", ()),
)
