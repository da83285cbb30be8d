"""Every vLLM name the project uses, imported here and nowhere else (vLLM 0.32 and 0.33).

vLLM's scheduler, KV-cache and connector classes are not a stable API. The rest
of `integrations` imports them from here and nowhere else, and every name it
overrides, calls or assigns is listed in `integrations.vllm_v1.vllm_surface.touches`,
which the surface test checks against each supported vLLM release's sources (names
and parameters), so an upgrade that renames one fails in CI, not silently in an engine.
Importing this module also checks, cheaply, that every method the project
overrides still exists on the installed vLLM (an override of a renamed private would
otherwise become dead code): `VllmSurfaceError` names the missing ones.

Between 0.32 and 0.33 nothing the project touches changed name or parameters (see
`touches` for what is checked); the names below import unchanged from both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name, sha256_cbor
from vllm.v1.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_group_id,
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, get_offload_group_idx
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from integrations.vllm_v1.vllm_surface.touches import OVERRIDES

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager

__all__ = [
    "AsyncScheduler", "AttentionMetadata", "CacheConfig", "CacheHitSource", "CachePolicy",
    "ChunkStatus", "EngineCoreOutput", "EngineCoreOutputs", "FinishReason", "ForwardContext",
    "FreeKVCacheBlockQueue", "FullAttentionSpec", "KVCacheBlock", "KVCacheBlocks", "KVCacheConfig",
    "KVCacheManager",
    "KVCacheGroupSpec", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorPromMetrics",
    "KVConnectorRole", "KVConnectorStats", "LLM", "ModelConfig", "ModelRunnerOutput", "OffloadKey",
    "ReqContext", "Request", "RequestQueue", "RequestStatus", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "StructuredOutputManager", "VllmConfig",
    "VllmSurfaceError", "cached_prefix_tokens", "get_group_id", "get_hash_fn_by_name",
    "get_offload_group_idx", "get_request_block_hasher", "init_none_hash",
    "make_block_hash_with_group_id", "ngram_propose", "order_request_keys", "platform_is_cpu",
    "register_cache_policy", "register_kv_connector", "sha256_cbor", "swap_free_block_queue",
    "tensor_parallel_rank",
]


class VllmSurfaceError(ImportError):
    """The installed vLLM lacks a name this project overrides."""


def _check_overrides() -> None:
    classes = {"Scheduler": Scheduler, "FreeKVCacheBlockQueue": FreeKVCacheBlockQueue,
               "RequestQueue": RequestQueue, "KVConnectorBase_V1": KVConnectorBase_V1}
    missing = [f"{owner}.{name}" for owner, names in OVERRIDES.items()
               for name in names if not hasattr(classes[owner], name)]
    if missing:
        import vllm

        raise VllmSurfaceError(f"vLLM {vllm.__version__} lacks {', '.join(missing)}, which "
                               "llm-serving-policies overrides; supported: 0.32.x, 0.33.x")


_check_overrides()


def __getattr__(name: str) -> Any:
    if name == "LLM":  # the offline engine entry point: imported only when asked for
        from vllm import LLM

        return LLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ngram_propose() -> Any:
    """vLLM's n-gram matcher (``ngram_proposer._find_longest_matched_ngram_and_propose_tokens``)."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    return _find_longest_matched_ngram_and_propose_tokens


def register_kv_connector(name: str, module: str, cls: str) -> None:
    """Make ``kv_connector: name`` load ``module.cls`` (once per process)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if name not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(name, module, cls)


def register_cache_policy(name: str, module: str, cls: str) -> None:
    """Make the offloading connector's ``eviction_policy: name`` load ``module.cls``."""
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    if name not in CachePolicyFactory._registry:
        CachePolicyFactory.register_cache_policy(name, module, cls)


def platform_is_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (no asynchronous scheduling there)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def tensor_parallel_rank() -> int:
    """This worker's tensor-parallel rank."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def cached_prefix_tokens(kv_cache_manager: Any, request: Request) -> int:
    """Prompt tokens of ``request`` the prefix cache would serve if it were scheduled now.

    Read-only: the same lookup as vLLM's ``get_computed_blocks`` (the last token is
    always recomputed), without touching blocks, stats or KV events.
    """
    if (not kv_cache_manager.enable_caching
            or not kv_cache_manager.prefix_cache_lookup_enabled(request)):
        return 0
    _, tokens, _ = kv_cache_manager.coordinator.find_longest_cache_hit(
        request.block_hashes, request.num_tokens - 1)
    return min(tokens, request.num_prompt_tokens)


def swap_free_block_queue(kv_cache_manager: Any, make_queue: Any) -> Any:
    """Replace the block pool's free-block queue by ``make_queue(free blocks in order)``.

    vLLM allocates from ``block_pool.free_block_queue`` and offers no hook for its
    order; replacing the instance on our own scheduler's pool is the seam.
    """
    pool = kv_cache_manager.block_pool
    queue = make_queue(pool.free_block_queue.get_all_free_blocks())
    pool.free_block_queue = queue
    return queue


# -- Ray Serve engine replicas (integrations.ray_serve.engine) --------------------------
# vLLM's public engine and server entry points, imported when first asked for (they pull
# in FastAPI and the whole OpenAI server). `vllm.entrypoints.cli.serve` re-exports the
# argument parser in 0.32 (from launchers.cli_args) and in 0.33 (from common.cli_args).
__all__ += ["async_llm", "openai_app", "parse_serve_args"]


def parse_serve_args(argv: list[str]) -> Any:
    """``vllm serve``'s arguments parsed from ``argv`` (its own parser and checks)."""
    from vllm.entrypoints.cli.serve import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def async_llm(args: Any) -> Any:
    """vLLM's asynchronous engine for parsed serve ``args``
    (``AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(args))``; spawns the engine
    core with the default multiprocessing executor)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(args))


async def openai_app(engine: Any, args: Any) -> Any:
    """vLLM's OpenAI application over ``engine``, built as ``vllm serve`` builds it
    (``build_app`` + ``init_app_state``: routes, middlewares, ``/metrics``)."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await engine.get_supported_tasks()
    app = build_app(args, tasks, engine.model_config)
    await init_app_state(engine, app.state, args, tasks)
    return app
