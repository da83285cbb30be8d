"""`KVTierConfig`: the settings of the tiered KV connector, and the engine kwargs that enable it.

Importing this module does not import vLLM or torch, so a config can be built
(and validated) anywhere; `integrations.vllm_v1.cache.tiers.connector` reads it back
from ``kv_transfer_config.kv_connector_extra_config`` inside the engine.
"""

from __future__ import annotations

from typing import Any

import attrs

CONNECTOR_CLS = "KVTierConnector"
CONNECTOR_MODULE = "integrations.vllm_v1.cache.tiers.connector"
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def cpu_core_env(ranks: int = 1) -> dict[str, str]:
    """Environment that gives a CPU engine with `KVTierConnector` the core layout it has without.

    vLLM's CPU build keeps one core per rank free for the engine-core process, and one more per
    rank whenever any KV connector is configured (for NIXL's transfer thread; see
    ``vllm/utils/ompmultiprocessing.py``). `KVTierConnector` copies blocks on the worker's own
    thread and needs no such core; on a small machine the extra reservation leaves none to
    reserve, so vLLM binds the worker's OpenMP threads to every core, the busy engine core's
    included (measured on 2 cores: round 1 of ``benchmarks.kv_tier`` 8.8x slower than stock,
    against 1.4-2.5x with this environment; see the KV-cache docs).
    Put these variables in the environment of the process that starts the engine; vLLM reads
    them when it starts its workers. ``ranks``: tensor-parallel ranks on this machine.
    """
    return {RESERVED_CPU_ENV: str(ranks)}


@attrs.frozen(kw_only=True)
class KVTierConfig:
    """CPU and disk tiers behind vLLM's GPU prefix cache, in blocks of the engine's block size."""

    cpu_blocks: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    """Blocks the CPU DRAM tier holds."""
    disk_blocks: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Blocks the disk tier holds; 0: no disk tier (blocks leaving the CPU tier are dropped)."""
    disk_path: str | None = None
    """Directory for the disk tier's files (one file per block); ``None``: a fresh temporary
    directory per worker, removed at shutdown."""
    high_priority_at_most: int | None = None
    """Requests with ``priority <=`` this (vLLM: lower is more urgent) are high priority: their
    blocks never go to disk. ``None``: no request is high priority."""
    prefetch_requests: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Each step, bring disk blocks of this many waiting requests (oldest first) up to the CPU
    tier; 0 disables prefetching."""
    prefetch_blocks: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    """At most this many blocks are prefetched per step."""

    def extra_config(self) -> dict[str, Any]:
        """The ``kv_connector_extra_config`` dict this config round-trips through."""
        return attrs.asdict(self)

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any]) -> KVTierConfig:
        """Inverse of `extra_config`; unknown keys raise ``TypeError``."""
        return cls(**extra)

    def transfer_config(self) -> dict[str, Any]:
        """vLLM's ``kv_transfer_config`` that loads `KVTierConnector` with this config."""
        return {"kv_connector": CONNECTOR_CLS, "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_both", "kv_connector_extra_config": self.extra_config()}

    def engine_kwargs(self, **engine_kwargs: Any) -> dict[str, Any]:
        """``engine_kwargs`` plus ``kv_transfer_config`` (compose with ``Pipeline.llm(**...)``)."""
        if "kv_transfer_config" in engine_kwargs:
            raise ValueError("kv_transfer_config is set by KVTierConfig; do not pass it")
        return {**engine_kwargs, "kv_transfer_config": self.transfer_config()}
