"""vLLM plugin (entry point group ``vllm.general_plugins``): registers this project's
components under short names in every vLLM process, so plain flags can name them.

With the package installed, vLLM runs `register` at start-up; then

* ``--kv-transfer-config '{"kv_connector": "KVTierConnector", "kv_role": "kv_both", ...}'``
  needs no ``kv_connector_module_path``;
* the native offloading connector's ``kv_connector_extra_config`` takes
  ``"eviction_policy": "segmented_lru"`` with no ``cache_policy_module_path``.

The scheduler is named with ``--scheduler-cls`` (vLLM has no scheduler registry) and
the HTTP middlewares with ``--middleware``; see `integrations.vllm_v1.config.spec`.

In vLLM's API server process (the main process), `register` also checks our
``--additional-config`` entry on the command line (`check_command_line`: the
pipeline, its hooks, the serving keys, ``--scheduling-policy``) and exits naming the
problem, seconds after the start, instead of after the engine core has started.

It also turns off uvicorn's default trust in ``X-Forwarded-For`` from ``127.0.0.1``
(`UVICORN_TRUSTED_PROXIES`), so a request's address is its connection's peer unless
``FORWARDED_ALLOW_IPS`` is set on purpose: our trusted-gateway check
(`integrations.vllm_v1.serving.tenants`) must not take a client's word for where it
is.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections.abc import Sequence

KV_CONNECTORS = {"KVTierConnector": ("integrations.vllm_v1.cache.tiers.connector",
                                     "KVTierConnector")}
CACHE_POLICIES = {"segmented_lru": ("integrations.vllm_v1.cache.offload_policy",
                                    "SegmentedLRUCachePolicy")}
UVICORN_TRUSTED_PROXIES = "FORWARDED_ALLOW_IPS"
"""uvicorn's list of peers whose ``X-Forwarded-For`` it believes (its default: 127.0.0.1)."""


def register() -> None:
    """Register the KV connector and offload cache policy names, trust no proxy by default
    and, in the API server, check our ``--additional-config`` (idempotent).

    Raises:
        SystemExit: naming the problem in a bad ``--additional-config``.
    """
    from integrations.vllm_v1.vllm_surface.names import (
        register_cache_policy,
        register_kv_connector,
    )

    for name, (module, cls) in KV_CONNECTORS.items():
        register_kv_connector(name, module, cls)
    for name, (module, cls) in CACHE_POLICIES.items():
        register_cache_policy(name, module, cls)
    os.environ.setdefault(UVICORN_TRUSTED_PROXIES, "")
    if multiprocessing.parent_process() is None:  # vLLM's API server, not an engine process
        from integrations.vllm_v1.config.declarative import PipelineConfigError

        try:
            check_command_line(sys.argv)
        except (PipelineConfigError, ValueError) as error:
            raise SystemExit(f"llm_serving_policies: bad --additional-config: {error}"
                             ) from None


def check_command_line(argv: Sequence[str]) -> None:
    """Check our entry in ``argv``'s ``--additional-config`` as the engine would, at once.

    Raises:
        PipelineConfigError: naming the key: a bad pipeline (unknown preset or slot, a
            wrong field type, a missing file), an unimportable hook, a bad serving key.
        ValueError: ``--scheduling-policy priority`` with a pipeline that orders requests.
    """
    from integrations.vllm_v1.config.declarative import PipelineConfigError
    from integrations.vllm_v1.config.spec import config_entry, pipeline_from_additional_config
    from integrations.vllm_v1.scheduling.features import named_hook
    from integrations.vllm_v1.scheduling.scheduler import check_scheduling_policy
    from integrations.vllm_v1.serving.drain import Drain
    from integrations.vllm_v1.serving.rejection_channel import channel_address
    from integrations.vllm_v1.serving.tenants import TenantBinding

    text = _flag(argv, "--additional-config")
    if text is None:
        return
    try:
        additional = json.loads(text)
    except ValueError as error:
        raise PipelineConfigError(f"--additional-config is not JSON ({error})") from None
    entry = config_entry(additional)
    if not entry:
        return
    pipeline = pipeline_from_additional_config(additional)
    for path in entry.get("hooks") or ():
        named_hook(path)
    TenantBinding.from_entry(entry)
    Drain.from_entry(entry)
    channel_address(entry)
    check_scheduling_policy(pipeline, _flag(argv, "--scheduling-policy") or "fcfs")


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The last value of ``name`` in ``argv`` (``name value`` or ``name=value``), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value
