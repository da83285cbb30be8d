"""vLLM plugin (entry point group ``vllm.general_plugins``): registers this project's
components under short names in every vLLM process, so plain flags can name them.

With the package installed, vLLM runs `register` at start-up; then

* ``--kv-transfer-config '{"kv_connector": "KVTierConnector", "kv_role": "kv_both", ...}'``
  needs no ``kv_connector_module_path``;
* the native offloading connector's ``kv_connector_extra_config`` takes
  ``"eviction_policy": "segmented_lru"`` with no ``cache_policy_module_path``.

The scheduler is named with ``--scheduler-cls`` (vLLM has no scheduler registry) and
the HTTP middlewares with ``--middleware``; see `integrations.vllm_v1.config.spec`.

It also turns off uvicorn's default trust in ``X-Forwarded-For`` from ``127.0.0.1``
(`UVICORN_TRUSTED_PROXIES`), so a request's address is its connection's peer unless
``FORWARDED_ALLOW_IPS`` is set on purpose: our trusted-gateway check
(`integrations.vllm_v1.serving.tenants`) must not take a client's word for where it
is.
"""

from __future__ import annotations

import os

KV_CONNECTORS = {"KVTierConnector": ("integrations.vllm_v1.cache.tiers.connector",
                                     "KVTierConnector")}
CACHE_POLICIES = {"segmented_lru": ("integrations.vllm_v1.cache.offload_policy",
                                    "SegmentedLRUCachePolicy")}
UVICORN_TRUSTED_PROXIES = "FORWARDED_ALLOW_IPS"
"""uvicorn's list of peers whose ``X-Forwarded-For`` it believes (its default: 127.0.0.1)."""


def register() -> None:
    """Register the KV connector and offload cache policy names and trust no proxy by
    default (idempotent)."""
    os.environ.setdefault(UVICORN_TRUSTED_PROXIES, "")
    from integrations.vllm_v1.vllm_surface.names import (
        register_cache_policy,
        register_kv_connector,
    )

    for name, (module, cls) in KV_CONNECTORS.items():
        register_kv_connector(name, module, cls)
    for name, (module, cls) in CACHE_POLICIES.items():
        register_cache_policy(name, module, cls)
