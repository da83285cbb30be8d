"""KV cache: what stays cached, what is ranked by it, what is warmed and where it lives.

Eviction orders, prompt versions, cache-aware ranking, prefix warming and tier placement.
Modules: `cache_aware`, `cache_warming`, `eviction`, `prompt_versions`, `tiering`. Its public
names are exported by `policies` (`from policies import ...`).
"""
