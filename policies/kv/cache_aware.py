"""Cache-aware ranking: requests whose prompt is already in the prefix cache go first.

A request whose prompt mostly hits the prefix cache costs little prefill, and
serving it soon uses its cached blocks before they are evicted. SGLang's
``lpm`` policy sorts the waiting queue by longest prefix match at every step and
falls back to first-come-first-served when the queue is long (the re-sort costs
O(queue) per step, and under a long queue cache-first ordering starves cold
requests). `CacheAwareRanker` keeps the pipeline's time-invariant keys instead:
the cached fraction is looked up once, on admission, and buys a bounded head
start in seconds, so the heap is never re-sorted and the base ranking's
starvation bound grows by at most ``bonus_s``. The fallback applies on admission
too: a request admitted while more than ``max_waiting_requests`` wait gets no
head start.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import attrs

from policies.needs import Needs
from policies.ordering.ranking import FCFSOrder
from policies.protocols import RankingPolicy
from policies.views import LoadSnapshot, RequestView


@runtime_checkable
class LoadAwareRanking(Protocol):
    """A ranking whose key may depend on the engine's load when the request is admitted.

    The scheduler calls `rank_key_under_load` instead of ``rank_key`` on admission
    and, for rankings that want it, fills `RequestView.cached_tokens` first.
    """

    def rank_key_under_load(self, request: RequestView, load: LoadSnapshot) -> float:
        """A key that does not change while the request waits, given the load on arrival."""
        ...


def _is_ranking(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, RankingPolicy):
        raise TypeError(f"{attribute.name} must implement RankingPolicy "
                        f"(rank_key, effective_priority), got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class CacheAwareRanker:
    """A base ranking with a head start of up to ``bonus_s`` for prompts found in the prefix cache.

    Keys are in seconds, like the base ranking's urgency::

        rank_key(r) = base.effective_priority(r, 0) - bonus_s * cached_fraction(r)

    where ``cached_fraction = cached_tokens / prompt_tokens`` (`RequestView.cached_tokens`,
    looked up by the scheduler on admission). ``base.effective_priority(r, now) + now`` is
    the base ranking's time-invariant key in seconds (``arrival_s`` for `FCFSOrder`; the
    ``rank_key`` of `QoSRanker` and `EDFRanker`).

    Guarantees:
        * Between requests of equal base key, a larger cached fraction is served first;
          with equal cached fractions the base order is kept.
        * ``base key - bonus_s <= rank_key <= base key``: a request is never overtaken
          by one that the base ranking would have served more than ``bonus_s`` seconds
          later (for `QoSRanker`: ``max_overtake_s + bonus_s``), so nothing starves.
        * Fallback: when more than ``max_waiting_requests`` requests wait on admission,
          `rank_key_under_load` is the base key, so such requests keep the base order
          (arrival order for `FCFSOrder`).
    """

    needs: ClassVar[Needs] = Needs(load_at_rank=True, prefix_hits=True)

    base: RankingPolicy = attrs.field(factory=FCFSOrder, validator=_is_ranking)
    """The ranking the head start is taken from (must age one second per second waited)."""
    bonus_s: float = attrs.field(default=2.0, validator=[attrs.validators.ge(0.0),
                                                         attrs.validators.lt(float("inf"))])
    """Head start of a fully cached prompt, in seconds of waiting (2 s: one `QoSRanker`
    priority step)."""
    max_waiting_requests: int = attrs.field(default=128, validator=attrs.validators.ge(0))
    """Above this many waiting requests on admission, no head start (SGLang falls back to
    FCFS above 128)."""

    def cached_fraction(self, request: RequestView) -> float:
        """Share of the prompt found in the prefix cache on admission, in [0, 1]."""
        if request.prompt_tokens <= 0:
            return 0.0
        return min(1.0, request.cached_tokens / request.prompt_tokens)

    def base_key_s(self, request: RequestView) -> float:
        """The base ranking's time-invariant key, in seconds."""
        return self.base.effective_priority(request, 0.0)

    def rank_key(self, request: RequestView) -> float:
        """The key with the head start (light load)."""
        return self.base_key_s(request) - self.bonus_s * self.cached_fraction(request)

    def rank_key_under_load(self, request: RequestView, load: LoadSnapshot) -> float:
        """`rank_key`, or the base key when more than ``max_waiting_requests`` wait."""
        if load.waiting_requests > self.max_waiting_requests:
            return self.base_key_s(request)
        return self.rank_key(request)

    def effective_priority(self, request: RequestView, now: float) -> float:
        """Urgency at ``now`` in seconds (lower is served first): ``rank_key - now``."""
        return self.rank_key(request) - now
