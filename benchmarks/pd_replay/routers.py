"""The routers users would pick instead of `PDRouter`, from their documented behaviour.

- `PowerOfTwoRouter` (``pow2``): Ray Serve's default request router, power of two
  choices: sample two replicas at random and send the request to the one with fewer
  ongoing requests (Ray Serve docs, "Use Custom Algorithm for Request Routing" and
  the Ray Serve LLM routing page).
- `PrefixAffinityRouter` (``prefix_affinity``): Ray Serve LLM's
  ``PrefixCacheAffinityRouter`` ("PrefixCacheAffinityRouter for LLM inference
  optimization"): when the longest and the shortest replica queues differ by less
  than ``imbalanced_threshold`` (default 10) requests, match the prompt against a
  prefix tree of what each replica was sent; a match rate of at least
  ``match_rate_threshold`` (default 0.1) goes to the best-matching replica, a lower
  one to the replica with the smallest tree; otherwise (imbalanced, or no prefix
  data) power of two choices. Among several candidates the one with the shortest
  queue wins. The tree is not evicted (``do_eviction`` defaults to False).
- `KVOverlapRouter` (``kv_overlap``): Dynamo's KV router cost ("KV Router" /
  "Routing Concepts" / "Disaggregated Serving" in the Dynamo docs):
  ``overlap_score_weight * prefill_blocks + decode_blocks``, the lowest cost wins
  (temperature 0, ties at random). ``prefill_blocks`` are the worker's queued
  prompt tokens plus this prompt's tokens its cache does not hold, in blocks;
  ``decode_blocks`` are its active KV blocks. In disaggregated mode, as Dynamo
  documents, the prefill pool tracks no active blocks and the decode pool ignores
  prefix overlap and prompt tokens; with no prefill pool (aggregated) both terms count.

Each pool is routed on its own, as in those systems (a router per deployment or
worker pool). What every router knows of the caches is what it sent where (a
`PrefixIndex`, as Ray's tree and Dynamo's approximate mode without KV events);
queue lengths and KV usage come from the `InstanceLoad` the cluster reports. None of
them keeps sessions together (``session_id`` is accepted and ignored). The
prompt is matched in blocks of ``block_size_tokens`` (Ray matches characters of
the prompt text). Not modelled: Ray's ``max_ongoing_requests`` back-pressure and
its queue-length probing delays, Dynamo's router replicas and KV-event lag.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence

import attrs

from policies.pd.index import PrefixIndex
from policies.pd.router import (
    InstanceLoad,
    RouteDecision,
    RouteReason,
    _IndexedRouter,
    _RouterBase,
)
from policies.validators import finite_non_negative, fraction, int_at_least

__all__ = ["KVOverlapRouter", "PowerOfTwoRouter", "PrefixAffinityRouter"]

_UNBOUNDED_BLOCKS = 1 << 40
"""Index capacity standing for "never evicted"."""


_positive_int = int_at_least(1)


def _load(loads: Mapping[str, InstanceLoad], name: str) -> InstanceLoad:
    try:
        return loads[name]
    except KeyError:
        raise KeyError(f"loads has no entry for healthy instance {name!r}") from None


@attrs.define(eq=False, kw_only=True)
class PowerOfTwoRouter(_RouterBase):
    """Ray Serve's default: of two random healthy instances, the one with fewer ongoing requests.

    Each pool on its own; a pool of one healthy instance gets every request. Ties go
    to the first of the two draws. Deterministic given the inputs and ``rng``.
    """

    rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """A decode and a prefill instance, each the shorter queue of two random draws."""
        loads = loads or {}
        decode = self._pow2(self._healthy(self.decode), loads)
        if decode is None:
            return self._count(self._unavailable(request_id))
        prefill = self._pow2(self._healthy(self.prefill), loads)
        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=(RouteReason.LEAST_LOADED if prefill else
                            RouteReason.NO_PREFILL_INSTANCE),
            decode_reason=RouteReason.LEAST_LOADED))

    def _pow2(self, names: Sequence[str], loads: Mapping[str, InstanceLoad]) -> str | None:
        if not names:
            return None
        if len(names) == 1:
            return names[0]
        first, second = self.rng.sample(list(names), 2)
        if _load(loads, second).ongoing_requests < _load(loads, first).ongoing_requests:
            return second
        return first


@attrs.define(eq=False, kw_only=True)
class PrefixAffinityRouter(_IndexedRouter, PowerOfTwoRouter):
    """Ray Serve LLM's ``PrefixCacheAffinityRouter``: prefix match while queues are balanced.

    Per pool: if the longest and shortest queues (ongoing requests) of its healthy
    instances differ by less than ``imbalanced_threshold``, the instances whose
    remembered prompts match the most of this one (when that match covers at least
    ``match_rate_threshold`` of the prompt), else those with the fewest remembered
    blocks, are the candidates, and the shortest queue among them wins (ties at
    random); otherwise power of two choices. The chosen instances remember the prompt.
    """

    block_size_tokens: int = attrs.field(validator=_positive_int)
    imbalanced_threshold: int = attrs.field(default=10, validator=_positive_int)
    """Queue-length spread (requests) from which load balancing overrides prefix matching."""
    match_rate_threshold: float = attrs.field(default=0.1, validator=fraction)
    """Share of the prompt a match must cover to route for cache affinity."""
    index_capacity_blocks: int | None = attrs.field(default=None)
    """Blocks remembered per instance; None: never evicted (Ray's ``do_eviction=False``)."""
    _index: PrefixIndex = attrs.field(init=False, repr=False)

    @index_capacity_blocks.validator
    def _check_capacity(self, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None:
            _positive_int(self, attribute, value)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._index = PrefixIndex(capacity_blocks=self.index_capacity_blocks or _UNBOUNDED_BLOCKS)

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """Per pool: affinity or the emptiest tree while balanced, else power of two choices."""
        loads = loads or {}
        matched = self._index.match(block_keys)
        decode, decode_reason = self._pick(self.decode, prompt_tokens, block_keys, loads, matched)
        if decode is None:
            return self._count(self._unavailable(request_id))
        prefill, prefill_reason = self._pick(self.prefill, prompt_tokens, block_keys, loads,
                                             matched)
        self._index.insert((decode, prefill) if prefill else (decode,), block_keys)
        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=prefill_reason or RouteReason.NO_PREFILL_INSTANCE,
            decode_reason=decode_reason,
            prefill_cached_blocks=matched.get(prefill, 0) if prefill else 0,
            decode_cached_blocks=matched.get(decode, 0)))

    def _pick(self, pool: tuple[str, ...], prompt_tokens: int, block_keys: Sequence[Hashable],
              loads: Mapping[str, InstanceLoad], matched: Mapping[str, int],
              ) -> tuple[str | None, RouteReason | None]:
        healthy = list(self._healthy(pool))
        if not healthy:
            return None, None
        queues = {name: _load(loads, name).ongoing_requests for name in healthy}
        balanced = max(queues.values()) - min(queues.values()) < self.imbalanced_threshold
        remembered = {name: self._index.blocks(name) for name in healthy}
        if not balanced or not block_keys or not any(remembered.values()):
            return self._pow2(healthy, loads), RouteReason.LEAST_LOADED
        best = max(matched.get(name, 0) for name in healthy)
        rate = min(1.0, best * self.block_size_tokens / max(1, prompt_tokens))
        if best and rate >= self.match_rate_threshold:
            candidates = [name for name in healthy if matched.get(name, 0) == best]
            reason = RouteReason.AFFINITY
        else:
            smallest = min(remembered.values())
            candidates = [name for name in healthy if remembered[name] == smallest]
            reason = RouteReason.LEAST_LOADED
        shortest = min(queues[name] for name in candidates)
        chosen = self.rng.choice([name for name in candidates if queues[name] == shortest])
        return chosen, reason



@attrs.define(eq=False, kw_only=True)
class KVOverlapRouter(_IndexedRouter, _RouterBase):
    """Dynamo's KV router: the lowest ``overlap_score_weight * prefill_blocks + decode_blocks``.

    ``prefill_blocks = (queued_prefill_tokens + prompt tokens not cached there) / block``
    and ``decode_blocks = kv_usage * kv_capacity_blocks`` (active blocks). In a
    disaggregated cluster the prefill pool is costed by ``prefill_blocks`` alone and
    the decode pool by ``decode_blocks`` alone; with no prefill pool both count.
    Ties at random (``rng``). The chosen instances remember the prompt (Dynamo's
    approximate mode: cache state predicted from routing decisions).
    """

    block_size_tokens: int = attrs.field(validator=_positive_int)
    kv_capacity_blocks: int = attrs.field(validator=_positive_int)
    """KV blocks of one instance, in blocks of ``block_size_tokens``."""
    overlap_score_weight: float = attrs.field(default=1.0, validator=finite_non_negative)
    """Dynamo's ``--kv-overlap-score-weight`` (default 1)."""
    index_capacity_blocks: int = attrs.field(default=100_000, validator=_positive_int)
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    _index: PrefixIndex = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._index = PrefixIndex(capacity_blocks=self.index_capacity_blocks)

    def cost(self, load: InstanceLoad, prompt_tokens: int, cached_blocks: int, *,
             prefill_term: bool, decode_term: bool) -> float:
        """The cost logit of one instance (lower is better)."""
        cost = 0.0
        if prefill_term:
            uncached = max(0, prompt_tokens - cached_blocks * self.block_size_tokens)
            cost += (self.overlap_score_weight
                     * (load.queued_prefill_tokens + uncached) / self.block_size_tokens)
        if decode_term:
            cost += load.kv_usage * self.kv_capacity_blocks
        return cost

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """The cheapest decode instance, then the cheapest prefill instance."""
        loads = loads or {}
        matched = self._index.match(block_keys)
        aggregated = not self.prefill
        decode = self._cheapest(self.decode, prompt_tokens, loads, matched,
                                prefill_term=aggregated, decode_term=True)
        if decode is None:
            return self._count(self._unavailable(request_id))
        prefill = self._cheapest(self.prefill, prompt_tokens, loads, matched,
                                 prefill_term=True, decode_term=False)
        self._index.insert((decode, prefill) if prefill else (decode,), block_keys)

        def reason(name: str | None, overlap_counts: bool) -> RouteReason:
            if name is None:
                return RouteReason.NO_PREFILL_INSTANCE
            return (RouteReason.AFFINITY if overlap_counts and matched.get(name)
                    else RouteReason.LEAST_LOADED)

        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=reason(prefill, True), decode_reason=reason(decode, aggregated),
            prefill_cached_blocks=matched.get(prefill, 0) if prefill else 0,
            decode_cached_blocks=matched.get(decode, 0)))

    def _cheapest(self, pool: tuple[str, ...], prompt_tokens: int,
                  loads: Mapping[str, InstanceLoad], matched: Mapping[str, int], *,
                  prefill_term: bool, decode_term: bool) -> str | None:
        healthy = self._healthy(pool)
        if not healthy:
            return None
        costs = [self.cost(_load(loads, name), prompt_tokens, matched.get(name, 0),
                           prefill_term=prefill_term, decode_term=decode_term)
                 for name in healthy]
        lowest = min(costs)
        return self.rng.choice([n for n, c in zip(healthy, costs, strict=True) if c == lowest])

