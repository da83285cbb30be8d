"""Prefill/decode routers: pick a prefill and a decode instance for each request.

A disaggregated deployment runs N prefill and M decode instances; a request's
prompt is computed on a prefill instance, its KV moves to a decode instance,
which generates the rest. `PDRouter` chooses both instances:

- **Prefix affinity**: an approximate `PrefixIndex` (`policies.pd.index`) remembers which instance was
  sent which prompt blocks (bounded, least recently routed forgotten first). A
  decode instance that holds a prefix needs less KV sent; a prefill instance
  that holds one computes less.
- **Bounded load**: an instance is eligible only while its load score is at most
  ``(1 + balance_epsilon) * mean + load_slack_tokens`` over its healthy pool, so
  a hot prefix cannot pile every request onto one instance. Among eligible
  instances the longest cached prefix wins, then the lower load score.
- **Session affinity**: a request with a ``session_id`` goes back to the instance
  that served its session's previous turn (which holds its context) while that
  instance's load score is at most the bound plus the prompt tokens it is believed
  to hold (what moving would recompute), at most ``session_slack_tokens``: a
  bounded overload penalty, past which the session moves (and stays) elsewhere.
- **Power-of-``choices``**: optionally score only ``choices`` random instances (plus
  the one with the longest cached prefix) instead of the whole pool.
- **Short suffix skips the prefill pool**: when the chosen decode instance lacks
  at most ``skip_prefill_max_tokens`` of the prompt, it computes them itself.
- **Health**: `mark_down` / `mark_up`; an instance that is down is never chosen
  while a healthy one exists in its pool.

`RoundRobinRouter` and `LeastLoadedRouter` are the baselines with no prefix
coordination. All three return a frozen `RouteDecision` and are deterministic
given their inputs and the injected ``rng``.
"""

from __future__ import annotations

import enum
import random
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType

import attrs

from policies.pd.index import PrefixIndex, chain_keys
from policies.validators import finite_non_negative, fraction, int_at_least

__all__ = ["InstanceLoad", "LeastLoadedRouter", "PDRouter", "PDRouterStats", "PrefixIndex",
           "RoundRobinRouter", "RouteDecision", "RouteReason", "chain_keys"]


_non_negative_int = int_at_least(0)
_positive_int = int_at_least(1)


def _names(_instance: object, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    if len(set(value)) != len(value) or not all(isinstance(n, str) and n for n in value):
        raise ValueError(f"{attribute.name} must be distinct non-empty names, got {value!r}")


@attrs.frozen(kw_only=True)
class InstanceLoad:
    """What the router knows of one instance's load."""

    queued_prefill_tokens: int = attrs.field(default=0, validator=_non_negative_int)
    """Prompt tokens admitted but not yet computed."""
    running_decodes: int = attrs.field(default=0, validator=_non_negative_int)
    """Requests generating tokens (or about to, e.g. KV on its way)."""
    kv_usage: float = attrs.field(default=0.0, validator=fraction)
    """Fraction of KV-cache blocks in use."""
    ongoing_requests: int = attrs.field(default=0, validator=_non_negative_int)
    """Requests on the instance or on their way to it, in any state (Ray Serve's queue length)."""


class RouteReason(enum.Enum):
    """Why an instance was chosen (or why none was)."""

    AFFINITY = "affinity"
    """It holds the longest cached prefix among the instances within the load bound."""
    SESSION = "session"
    """It served the session's previous turn and is within the load bound plus the session
    slack (the prompt tokens it holds, capped)."""
    SPILLOVER = "spillover"
    """A longer prefix sits on an instance over the load bound (or down); this one is next best."""
    LEAST_LOADED = "least_loaded"
    """No eligible instance holds any of the prefix: the lowest load score."""
    ROUND_ROBIN = "round_robin"
    """The next healthy instance in turn."""
    SHORT_SUFFIX = "short_suffix"
    """Prefill skipped: the decode instance computes the few uncached tokens itself."""
    NO_PREFILL_INSTANCE = "no_prefill_instance"
    """Prefill skipped: no prefill instance is healthy (or none exists)."""
    UNAVAILABLE = "unavailable"
    """No decode instance is healthy: the request cannot be served."""


@attrs.frozen(kw_only=True)
class RouteDecision:
    """Where one request goes; ``prefill is None`` means the decode instance prefills too."""

    request_id: str
    prefill: str | None
    decode: str | None
    """None only with ``decode_reason == UNAVAILABLE``."""
    prefill_reason: RouteReason
    decode_reason: RouteReason
    prefill_cached_blocks: int = 0
    """Blocks of the prompt the router believes the prefill instance holds."""
    decode_cached_blocks: int = 0
    """Blocks of the prompt the router believes the decode instance holds (not sent again)."""


@attrs.frozen(kw_only=True)
class PDRouterStats:
    """A snapshot of a router's counters since construction."""

    routed: int
    """`route` calls, unavailable ones included."""
    skipped_prefill: int
    """Decisions with no prefill instance (short suffix or no prefill instance up)."""
    unavailable: int
    """Decisions with no healthy decode instance."""
    failovers: int
    """Decisions that avoided a down instance holding the longest cached prefix."""
    prefill_reasons: Mapping[str, int]
    decode_reasons: Mapping[str, int]
    cached_blocks_reused: int
    """Sum of ``decode_cached_blocks``: blocks the router expects not to be sent."""
    down: tuple[str, ...]
    """Instances currently marked down, sorted."""
    index_blocks: int
    """Block keys in the prefix index, over all instances."""
    index_evictions: int


@attrs.define(eq=False, kw_only=True)
class _RouterBase:
    """Pools, health state and counters shared by every router."""

    prefill: tuple[str, ...] = attrs.field(converter=tuple, validator=_names)
    """Prefill instance names (may be empty: every request is prefilled on decode)."""
    decode: tuple[str, ...] = attrs.field(converter=tuple, validator=_names)
    _down: set[str] = attrs.field(init=False, repr=False, factory=set)
    _counts: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)
    _prefill_reasons: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)
    _decode_reasons: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)

    def __attrs_post_init__(self) -> None:
        if not self.decode:
            raise ValueError("decode must name at least one instance")
        if set(self.prefill) & set(self.decode):
            raise ValueError("an instance cannot be in both the prefill and the decode pool")

    def mark_down(self, name: str) -> None:
        """Stop routing to ``name`` (failed health check or error)."""
        self._check_known(name)
        self._down.add(name)

    def mark_up(self, name: str) -> None:
        """Route to ``name`` again."""
        self._check_known(name)
        self._down.discard(name)

    def is_up(self, name: str) -> bool:
        """Whether ``name`` may be chosen."""
        self._check_known(name)
        return name not in self._down

    def _check_known(self, name: str) -> None:
        if name not in self.prefill and name not in self.decode:
            raise KeyError(f"unknown instance {name!r}")

    def _healthy(self, pool: tuple[str, ...]) -> Sequence[str]:
        return [name for name in pool if name not in self._down] if self._down else pool

    def _count(self, decision: RouteDecision) -> RouteDecision:
        self._counts["routed"] += 1
        self._counts["skipped_prefill"] += decision.prefill is None and decision.decode is not None
        self._counts["unavailable"] += decision.decode is None
        self._counts["cached_blocks_reused"] += decision.decode_cached_blocks
        self._prefill_reasons[decision.prefill_reason.value] += 1
        self._decode_reasons[decision.decode_reason.value] += 1
        return decision

    def _unavailable(self, request_id: str) -> RouteDecision:
        return RouteDecision(request_id=request_id, prefill=None, decode=None,
                             prefill_reason=RouteReason.UNAVAILABLE,
                             decode_reason=RouteReason.UNAVAILABLE)

    def _index_stats(self) -> tuple[int, int]:
        return 0, 0

    def stats(self) -> PDRouterStats:
        """Counters since construction, and the current health state."""
        blocks, evictions = self._index_stats()
        return PDRouterStats(
            routed=self._counts["routed"], skipped_prefill=self._counts["skipped_prefill"],
            unavailable=self._counts["unavailable"], failovers=self._counts["failovers"],
            prefill_reasons=MappingProxyType(dict(sorted(self._prefill_reasons.items()))),
            decode_reasons=MappingProxyType(dict(sorted(self._decode_reasons.items()))),
            cached_blocks_reused=self._counts["cached_blocks_reused"],
            down=tuple(sorted(self._down)), index_blocks=blocks, index_evictions=evictions)

    def check_invariants(self) -> None:
        """Counters add up; only known instances are down."""
        assert self._down <= set(self.prefill) | set(self.decode)
        assert sum(self._decode_reasons.values()) == self._counts["routed"]
        assert sum(self._prefill_reasons.values()) == self._counts["routed"]
        assert self._counts["skipped_prefill"] + self._counts["unavailable"] <= self._counts[
            "routed"]


class _IndexedRouter:
    """What the routers that remember where they sent each prompt share: the `index`, its size
    in `stats` and its consistency in `check_invariants` (a router declares ``_index``)."""

    __slots__ = ()

    @property
    def index(self) -> PrefixIndex:
        """The prefix index: what each instance was sent (feed it KV events with
        `PrefixIndex.drop`)."""
        return self._index

    def _index_stats(self) -> tuple[int, int]:
        return (sum(self._index.blocks(n) for n in self.prefill + self.decode),
                self._index.evictions)

    def check_invariants(self) -> None:
        """Counters add up; the index is consistent and within capacity."""
        super().check_invariants()
        self._index.check_invariants()


@attrs.define(eq=False, kw_only=True)
class RoundRobinRouter(_RouterBase):
    """Each pool in turn, skipping instances that are down; ignores load, prefixes, sessions."""

    _turn: Counter[str] = attrs.field(init=False, repr=False, factory=Counter)

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """The next healthy prefill and decode instance (prefill None when none is healthy)."""
        decode = self._next("decode", self._healthy(self.decode))
        if decode is None:
            return self._count(self._unavailable(request_id))
        prefill = self._next("prefill", self._healthy(self.prefill))
        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=(RouteReason.ROUND_ROBIN if prefill else
                            RouteReason.NO_PREFILL_INSTANCE),
            decode_reason=RouteReason.ROUND_ROBIN))

    def _next(self, pool: str, healthy: list[str]) -> str | None:
        if not healthy:
            return None
        self._turn[pool] += 1
        return healthy[(self._turn[pool] - 1) % len(healthy)]


@attrs.define(eq=False, kw_only=True)
class LeastLoadedRouter(_RouterBase):
    """The healthy instance with the lowest load score in each pool; ignores prefixes, sessions.

    Ties go to the earlier instance in its pool.
    """

    decode_weight_tokens: float = attrs.field(default=256.0, validator=finite_non_negative)
    """Load of one running decode, in prompt-token equivalents."""
    kv_weight_tokens: float = attrs.field(default=8192.0, validator=finite_non_negative)
    """Load of a full KV cache, in prompt-token equivalents."""

    def load_score(self, load: InstanceLoad) -> float:
        """``queued_prefill_tokens + decode_weight·running_decodes + kv_weight·kv_usage``.

        Non-decreasing in each of the three load measures.
        """
        return (load.queued_prefill_tokens + self.decode_weight_tokens * load.running_decodes
                + self.kv_weight_tokens * load.kv_usage)

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """The least-loaded healthy instance of each pool (``loads`` must cover them)."""
        decode = self._least(self._healthy(self.decode), loads or {})
        if decode is None:
            return self._count(self._unavailable(request_id))
        prefill = self._least(self._healthy(self.prefill), loads or {})
        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=(RouteReason.LEAST_LOADED if prefill else
                            RouteReason.NO_PREFILL_INSTANCE),
            decode_reason=RouteReason.LEAST_LOADED))

    def _scores(self, names: list[str], loads: Mapping[str, InstanceLoad]) -> list[float]:
        decode_weight, kv_weight = self.decode_weight_tokens, self.kv_weight_tokens
        try:
            return [(load := loads[name]).queued_prefill_tokens
                    + decode_weight * load.running_decodes + kv_weight * load.kv_usage
                    for name in names]
        except KeyError as missing:
            raise KeyError(f"loads has no entry for healthy instance {missing.args[0]!r}") from None

    def _least(self, names: list[str], loads: Mapping[str, InstanceLoad]) -> str | None:
        if not names:
            return None
        scores = self._scores(names, loads)
        return names[scores.index(min(scores))]


@attrs.define(eq=False, kw_only=True)
class PDRouter(_IndexedRouter, LeastLoadedRouter):
    """Load- and prefix-aware PD routing with bounded load and failover.

    Guarantees, for each pool: a down instance is never chosen while a healthy
    one exists; the chosen instance's load score is within the bound
    ``(1 + balance_epsilon) * mean + load_slack_tokens`` (the mean over the
    pool's healthy instances), or within the bound plus the session slack (the
    prompt tokens it holds, at most ``session_slack_tokens``) when it is the healthy
    instance that served the request's session's previous turn (which then wins);
    otherwise, among the considered instances within the
    bound it holds the longest cached prefix, ties going to the lower load score,
    then the earlier instance. Raising one instance's load never makes it chosen
    when it was not. Deterministic given the inputs and ``rng``.
    """

    block_size_tokens: int = attrs.field(validator=_positive_int)
    """Prompt tokens per block key."""
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    """Draws the power-of-``choices`` samples."""
    balance_epsilon: float = attrs.field(default=0.1, validator=fraction)
    """How far above the pool's mean load score an instance stays eligible (relative)."""
    load_slack_tokens: float = attrs.field(default=1024.0, validator=finite_non_negative)
    """How far above ``(1 + balance_epsilon) * mean`` it stays eligible (absolute)."""
    choices: int | None = attrs.field(default=None)
    """Score only this many random healthy instances (plus the best-prefix one); None: all."""
    skip_prefill_max_tokens: int = attrs.field(default=256, validator=_non_negative_int)
    """Skip the prefill pool when the decode instance lacks at most this many prompt tokens."""
    index_capacity_blocks: int = attrs.field(default=100_000, validator=_positive_int)
    """Keys the prefix index keeps per instance (size it near the instance's KV blocks)."""
    session_slack_tokens: float = attrs.field(default=8192.0, validator=finite_non_negative)
    """The most a session's previous instance may be above the load bound and stay its
    choice; below that cap the slack is the prompt tokens it holds (the recompute a move
    would cost), so the overload a session accepts is bounded by what it saves."""
    session_capacity: int = attrs.field(default=100_000, validator=_positive_int)
    """Sessions remembered (least recently routed forgotten first)."""
    _index: PrefixIndex = attrs.field(init=False, repr=False)
    _members: dict[tuple[str, ...], frozenset[str]] = attrs.field(init=False, repr=False)
    _homes: OrderedDict[str, dict[tuple[str, ...], str]] = attrs.field(
        init=False, repr=False, factory=OrderedDict)
    """Session -> pool -> the instance that served its last turn in that pool."""

    @choices.validator
    def _check_choices(self, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None:
            _positive_int(self, attribute, value)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._index = PrefixIndex(capacity_blocks=self.index_capacity_blocks)
        self._members = {pool: frozenset(pool) for pool in (self.prefill, self.decode)}

    def mark_up(self, name: str, *, cache_lost: bool = False) -> None:
        """Route to ``name`` again; ``cache_lost`` forgets what it held (it restarted)."""
        super().mark_up(name)
        if cache_lost:
            self._index.clear(name)
            for homes in self._homes.values():
                for pool in [pool for pool, home in homes.items() if home == name]:
                    del homes[pool]

    def check_invariants(self) -> None:
        """Counters add up; the index is consistent; sessions within capacity, homed in their
        pools."""
        super().check_invariants()
        assert len(self._homes) <= self.session_capacity
        assert all(home in pool for homes in self._homes.values()
                   for pool, home in homes.items())

    def route(self, request_id: str, prompt_tokens: int, block_keys: Sequence[Hashable] = (),
              loads: Mapping[str, InstanceLoad] | None = None, *,
              session_id: str | None = None) -> RouteDecision:
        """Choose a decode instance, then a prefill instance unless the uncached suffix is short.

        ``block_keys`` are chained keys of the prompt's full blocks (see `chain_keys`);
        ``loads`` must cover every healthy instance; ``session_id`` names the agent
        session (conversation) the request is a turn of, if any. Both chosen
        instances are recorded as holding the prompt's blocks and, with a
        ``session_id``, as the session's instances.
        """
        loads = loads or {}
        matched = self._index.match(block_keys)
        homes = self._session_homes(session_id)
        decode, decode_reason = self._pick(self.decode, loads, matched, homes.get(self.decode))
        if decode is None:
            return self._count(self._unavailable(request_id))
        decode_blocks = matched.get(decode, 0)
        uncached = prompt_tokens - decode_blocks * self.block_size_tokens
        prefill, prefill_reason = None, RouteReason.SHORT_SUFFIX
        if uncached > self.skip_prefill_max_tokens:
            prefill, prefill_reason = self._pick(self.prefill, loads, matched,
                                                 homes.get(self.prefill))
            prefill_reason = prefill_reason or RouteReason.NO_PREFILL_INSTANCE
        self._index.insert((decode, prefill) if prefill is not None else (decode,), block_keys)
        if session_id is not None:
            homes[self.decode] = decode
            if prefill is not None:
                homes[self.prefill] = prefill
        return self._count(RouteDecision(
            request_id=request_id, prefill=prefill, decode=decode,
            prefill_reason=prefill_reason, decode_reason=decode_reason,
            prefill_cached_blocks=matched.get(prefill, 0) if prefill else 0,
            decode_cached_blocks=decode_blocks))

    def _session_homes(self, session_id: str | None) -> dict[tuple[str, ...], str]:
        """The session's instances per pool (a fresh, unremembered dict without a session)."""
        if session_id is None:
            return {}
        homes = self._homes.pop(session_id, {})
        self._homes[session_id] = homes  # most recently routed last
        while len(self._homes) > self.session_capacity:
            self._homes.popitem(last=False)
        return homes

    def _pick(self, pool: tuple[str, ...], loads: Mapping[str, InstanceLoad],
              matched: Mapping[str, int], home: str | None = None,
              ) -> tuple[str | None, RouteReason | None]:
        healthy = self._healthy(pool)
        if not healthy:
            return None, None
        scores = self._scores(healthy, loads)
        bound = ((1 + self.balance_epsilon) * sum(scores) / len(scores)
                 + self.load_slack_tokens)
        if home in healthy and scores[healthy.index(home)] <= bound + min(
                self.session_slack_tokens, matched.get(home, 0) * self.block_size_tokens):
            return home, RouteReason.SESSION
        considered = range(len(healthy))
        if self.choices is not None and self.choices < len(healthy):
            best = max(considered, key=lambda i: matched.get(healthy[i], 0))  # first longest
            considered = sorted(set(self.rng.sample(considered, self.choices)) | {best})
        chosen, chosen_depth, chosen_score = -1, 0, 0.0
        for i in considered:  # the longest prefix, then the lower score, then the earlier
            score = scores[i]
            if score <= bound:
                depth = matched.get(healthy[i], 0)
                if chosen < 0 or depth > chosen_depth or (
                        depth == chosen_depth and score < chosen_score):
                    chosen, chosen_depth, chosen_score = i, depth, score
        if chosen < 0:  # every considered instance is over the bound; the least loaded is not
            chosen = scores.index(min(scores))
        name = healthy[chosen]
        members = self._members[pool]
        longest = max((v for n, v in matched.items() if n in members), default=0)
        if longest > matched.get(name, 0):
            self._counts["failovers"] += any(
                n in self._down and v == longest for n, v in matched.items() if n in members)
            return name, RouteReason.SPILLOVER
        return name, RouteReason.AFFINITY if longest else RouteReason.LEAST_LOADED
