"""A restart in the middle of a trace: a cold prefix cache vs one warmed by `PrefixWarmer`.

The trace's requests before ``restart_index`` are shown to a `PrefixWarmer` (block keys, arrival
times); then the engine restarts with an empty cache. ``cold`` replays the next ``window``
requests from there; ``warmed`` first pre-populates the cache with the warmer's hot prefixes
(highest score x length first, at most ``warm_fraction`` of the cache), as the engine does on a
restart from its saved hot set, then replays the same requests. Both evict in vLLM's LRU order,
so the difference is warming alone. Hit rates count only the real requests' prompt blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import attrs

from benchmarks.cache_replay.simulate import Chain, replay_order
from policies.kv.cache_warming import PrefixWarmer
from policies.kv.eviction import LRU


@attrs.frozen(kw_only=True)
class RestartResult:
    """Hit rates after a restart, cold and warmed, at one cache size."""

    cache_blocks: int
    restart_index: int
    window: int
    cold_hit_rate: float
    warmed_hit_rate: float
    warm_prefixes: int
    warm_blocks: int
    """Blocks the warm-up prefilled (the work warming costs)."""


def warm_chains(chains: Sequence[Chain], arrivals: Sequence[float], warmer: PrefixWarmer,
                budget_blocks: int) -> list[list[Hashable]]:
    """The hot prefixes ``warmer`` learns from ``chains``, within ``budget_blocks`` blocks."""
    for chain, now in zip(chains, arrivals, strict=True):
        warmer.observe(chain, chain, 1, now)
    chosen, used = [], 0
    for prefix in warmer.hot(arrivals[-1] if arrivals else 0.0):
        if used + len(prefix.tokens) <= budget_blocks:
            chosen.append(list(prefix.tokens))
            used += len(prefix.tokens)
    return chosen


def replay_restart(chains: Sequence[Chain], arrivals: Sequence[float], cache_blocks: int, *,
                   restart_index: int, window: int, warm_fraction: float = 0.5,
                   warmer: PrefixWarmer | None = None) -> RestartResult:
    """Cold vs warmed hit rate over ``window`` requests after a restart at ``restart_index``."""
    after = list(chains[restart_index:restart_index + window])
    warm = warm_chains(chains[:restart_index], arrivals[:restart_index],
                       warmer or PrefixWarmer(), int(cache_blocks * warm_fraction))
    cold = replay_order(after, cache_blocks, LRU(), "cold")
    with_warm = replay_order(warm + after, cache_blocks, LRU(), "warmed")
    warm_only = replay_order(warm, cache_blocks, LRU(), "warm-up")
    hits = with_warm.hit_blocks - warm_only.hit_blocks
    total = with_warm.prompt_blocks - warm_only.prompt_blocks
    return RestartResult(cache_blocks=cache_blocks, restart_index=restart_index, window=window,
                         cold_hit_rate=cold.hit_rate, warmed_hit_rate=hits / total if total else 0.0,
                         warm_prefixes=len(warm), warm_blocks=sum(map(len, warm)))
