"""`DuelingSLRU`: `SegmentedLRU` that turns itself into LRU where frequency does not pay.

Set dueling (Qureshi et al., ISCA'07) between two shadow caches: a plain `LRU` and a
`SegmentedLRU`, each holding keys only (no data), both as large as the real cache and
both fed the access stream the real order sees (a prefix hit is an ``acquire``; a block
computed anew is ``release``d without one). Each shadow counts the accesses it would
have hit (a key it holds whose parent it holds too, vLLM's prefix rule), with
exponential decay. The real order is a `SegmentedLRU` whose PROTECTED segment has its
usual share while the SLRU shadow leads and none while the LRU shadow leads (by more than
``switch_margin_hits`` to turn into LRU, since that empties PROTECTED): then every release
goes to PROBATION in release order, which is LRU (orphans still go first, which loses no
hit).

So on a workload where frequency pays the real order is `SegmentedLRU`, and where it
does not (agent sessions whose growing context is used once per turn), it is LRU, and it
follows the better one within the decay window. Cost: per sampled call, a shadow
`SegmentedLRU`'s bookkeeping and an LRU queue's besides the real order's (and a second LRU
queue's once judged session pins have seen a session), still O(1) amortised (a pin costs
O(log pins)); memory at most four times `SegmentedLRU`'s.

Session pins (``session_pins``, `SessionHints`): when a turn of an agent session finishes,
its blocks are pinned until ``gap_slack`` times the session's predicted gap (`SessionGaps`)
has passed. A pinned block keeps its place in the order; if it reaches the front of the
segment evicted next while pinned, it is held in PINNED instead of evicted, and if its pin
runs out there it goes back to the front of PROBATION, where LRU would have it. So a pin
changes nothing until it saves a block, and a pin that ran out leaves the order as it would
have been (pins that went back to the newest end cost up to 0.5 points against LRU on
held-out agent traces). At most ``max_pinned_fraction`` of the cache is pinned: a turn
finishing while that many blocks are pinned is not pinned (older pins are not pushed out, so
a subset of the sessions stays cached instead of all of them taking turns to miss, LRU's
loop failure), and blocks in PINNED are evicted, farthest predicted return first, when
nothing but WANTED is left (early release under pressure).
Tenants (`SessionHints.turn_started` names the request's tenant): a session id names a
session within its tenant, each pin is charged to the tenant whose turn made it, and each
tenant may hold at most its share of the pinned budget (``SessionPins.tenant_weights``, equal
by default, among the tenants holding or asking for pins: one tenant alone may use all of
it); a tenant under its share whose turn finds the budget full ends the oldest pin of the
tenant most over its share. Once two tenants were seen, judged pins are judged per tenant,
on the shadows' hits on that tenant's keys, so pins that never pay (sessions that never
come back) stay off for their tenant alone.
The SLRU and LRU shadows do not pin, and no shadow hears the waiting queue
(`SegmentedLRU.keep_waiting`: blocks a waiting request will hit are kept after pins).
Pins are judged (`SessionPins.judged`) by a third shadow, the LRU shadow's twin that pins
as the real order would: pins are made only while it leads the LRU shadow by more than
``switch_margin_hits`` decayed hits, and stop once the LRU shadow leads it by as much. So
LRU is the floor until pins prove themselves, and on traffic where they cost hits (many
short sessions with erratic tool times) the order stays LRU, with no trial to pay for.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import attrs

from policies.eviction import (
    _PINNED,
    _PROBATION,
    _PROTECTED,
    _WANTED,
    LRU,
    EvictionStats,
    Segment,
    SegmentedLRU,
)
from policies.session_retention import SessionGaps, SessionPins, session_tenant


def _push_farthest(heap: list, entry: tuple, pins: dict) -> None:
    """Push ``entry`` (``(-until, -sequence, key)``) onto a farthest-return heap whose live
    entries are those ``pins`` (key -> ``(until, sequence)``) still holds; once stale entries
    (pins hit or expired since) make up more than half the heap it is rebuilt, so its size
    stays within twice the pins held plus a constant, O(1) amortised per push."""
    heapq.heappush(heap, entry)
    if len(heap) > 2 * len(pins) + 64:
        heap[:] = [(until, seq, key) for until, seq, key in heap
                   if pins.get(key) == (-until, -seq)]
        heapq.heapify(heap)


@attrs.define(eq=False, kw_only=True)
class _TenantPins:
    """Who made each pin, and each tenant's share of the pinned budget: ``weights`` of the
    tenants that hold or ask for pins now (others 1), so a tenant alone may use all of it."""

    weights: dict = attrs.field(factory=dict)
    _owner: dict = attrs.field(factory=dict)
    """Pinned key -> the tenant charged for it (the one that pinned it first)."""
    _keys: dict = attrs.field(factory=dict)
    """Tenant -> its pinned keys, oldest pin first."""

    def add(self, key: Hashable, tenant: str | None) -> None:
        """Charge a new pin of ``key`` to ``tenant`` (a renewed one stays with its maker)."""
        if key not in self._owner:
            self._owner[key] = tenant
            self._keys.setdefault(tenant, OrderedDict())[key] = None

    def drop(self, key: Hashable) -> None:
        """``key``'s pin ended (nothing if it had none)."""
        if key in self._owner:
            tenant = self._owner.pop(key)
            keys = self._keys[tenant]
            del keys[key]
            if not keys:
                del self._keys[tenant]

    def owner(self, key: Hashable) -> str | None:
        return self._owner[key]

    def counts(self) -> dict[str | None, int]:
        """Pinned keys by tenant (tenants holding none left out)."""
        return {tenant: len(keys) for tenant, keys in self._keys.items()}

    def admit(self, tenant: str | None, limit: int) -> tuple[bool, Hashable | None]:
        """Whether ``tenant`` may make one more pin with ``limit`` pins in all, and the pin
        to end first to make room (the oldest of the tenant most over its share), if any."""
        held = len(self._owner)
        keys = self._keys
        if len(keys) <= 1 and (tenant in keys or not keys):  # one tenant: the whole budget
            return held < limit, None
        weight = self.weights.get
        active = keys.keys() | {tenant}
        total = sum(weight(t, 1.0) for t in active)
        if len(keys.get(tenant, ())) >= limit * weight(tenant, 1.0) / total:
            return False, None  # at its share (every tenant is, with no budget)
        if held < limit:
            return True, None
        over, victim = 0.0, None
        for other, its in keys.items():
            excess = len(its) - limit * weight(other, 1.0) / total
            if other != tenant and excess > over:
                over, victim = excess, next(iter(its))
        return victim is not None, victim

    def check_invariants(self, pinned: dict) -> None:
        """Assert that exactly the keys of ``pinned`` are charged, each to one tenant."""
        assert self._owner.keys() == pinned.keys(), (len(self._owner), len(pinned))
        assert sum(len(keys) for keys in self._keys.values()) == len(self._owner)
        assert all(keys for keys in self._keys.values())


@attrs.define(eq=False, kw_only=True)
class _Shadow:
    """A key-only cache fed the real order's accesses; counts the ones it would have hit.

    Subclasses hold the keys: `_OrderShadow` in an eviction order, `_LRUShadow` in a queue
    (plain LRU needs no per-key metadata).
    """

    score: float = 0.0
    """Decayed hits."""
    hits: int = 0
    accesses: int = 0

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` is cached (referenced or evictable)."""
        raise NotImplementedError

    def _count(self, held: bool, parent: Hashable | None) -> None:
        """One access, a hit if the key was ``held`` and so is its ``parent`` (if any)."""
        self.accesses += 1
        if held and (parent is None or self.holds(parent)):
            self.score += 1.0
            self.hits += 1

    def check_invariants(self) -> None:
        """Assert that no more accesses hit than were counted."""
        assert self.hits <= self.accesses, (self.hits, self.accesses)


@attrs.define(eq=False, kw_only=True)
class _OrderShadow(_Shadow):
    """A `_Shadow` whose keys wait in an eviction order (a `SegmentedLRU` in the duel)."""

    order: LRU = attrs.field(factory=SegmentedLRU)
    _in_use: set = attrs.field(factory=set)
    """Keys computed by the shadow and referenced, not released yet."""

    def holds(self, key: Hashable) -> bool:
        return key in self._in_use or self.order.tracks(key)

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """``key`` (below ``parent``) is used by a request; it becomes referenced."""
        entry = self.order._entries.get(key)  # the order's own table: its methods cost more
        held = entry is not None or key in self._in_use
        self._count(held, parent)
        if entry is not None and entry.segment is not None:
            self.order.acquire(key)
        elif not held:
            self.trim(capacity - 1)
            self._in_use.add(key)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """The real order released ``key``: an access first unless the shadow had it in use."""
        order, in_use = self.order, self._in_use
        entries = order._entries
        entry = entries.get(key)
        if entry is None and key not in in_use or entry is not None and entry.segment is not None:
            self.access(key, parent, capacity)
        in_use.discard(key)
        held = parent is not None and (parent in in_use or parent in entries)
        order.release(key, parent if held else None)
        if parent in in_use and parent in entries:  # SegmentedLRU linked it
            in_use.discard(parent)

    def restricted(self, keep: Callable[[Hashable], bool]) -> _OrderShadow:
        """A new shadow holding the kept keys of this one, evictable ones released in this
        one's eviction order, PROTECTED ones protected again (as roots; no counts)."""
        shadow = _OrderShadow(in_use={key for key in self._in_use if keep(key)})
        for key in self.order:
            if keep(key):
                shadow.order.release(
                    key, protect=self.order.segment_of(key) is Segment.PROTECTED)
        return shadow

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached or none is evictable."""
        order, in_use = self.order, self._in_use
        entries, segments = order._entries, order._segments
        while len(entries) + len(in_use) > capacity and any(segments):
            order.evict()

    def check_invariants(self) -> None:
        """Assert the order's invariants and the counts'."""
        super().check_invariants()
        self.order.check_invariants()


@attrs.define(eq=False, kw_only=True)
class _LRUShadow(_Shadow):
    """A `_Shadow` that evicts as `LRU`: counts the hits an `_OrderShadow` over `LRU` would,
    with a set and a queue instead of an order's metadata."""

    _held: set = attrs.field(factory=set)
    """Cached keys, referenced or evictable."""
    _queue: OrderedDict = attrs.field(factory=OrderedDict)
    """Evictable keys, least recently released first."""

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """``key`` (below ``parent``) is used by a request; it becomes referenced."""
        held = key in self._held
        self._count(held, parent)
        if held:
            self._queue.pop(key, None)
        else:
            self.trim(capacity - 1)
            self._held.add(key)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """The real order released ``key``: an access first unless the shadow had it in use."""
        if key in self._queue or key not in self._held:
            self.access(key, parent, capacity)
        self._queue[key] = None

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached or none is evictable."""
        held, queue = self._held, self._queue
        while len(held) > capacity and queue:
            held.remove(queue.popitem(last=False)[0])

    def restricted(self, keep: Callable[[Hashable], bool]) -> _LRUShadow:
        """A new shadow holding the kept keys of this one, in the same order (no counts)."""
        return _LRUShadow(held={key for key in self._held if keep(key)},
                          queue=OrderedDict((key, None) for key in self._queue if keep(key)))

    def check_invariants(self) -> None:
        """Assert that every evictable key is cached, and the counts'."""
        super().check_invariants()
        assert all(key in self._held for key in self._queue)


@attrs.define(eq=False, kw_only=True)
class _PinnedLRUShadow(_LRUShadow):
    """An `_LRUShadow` that pins a finished turn's keys as `DuelingSLRU` does: a pinned key
    keeps its place in the queue; one that reaches the front while pinned is parked beside
    it until its pin runs out (then it goes back to the front, the oldest, where LRU would
    have it) or it is hit; parked keys are evicted, farthest predicted return first, only
    once the queue is empty."""

    _pinned: dict = attrs.field(factory=dict)
    """Pinned key -> ``(until, sequence)`` of its latest pin."""
    _parked: set = attrs.field(factory=set)
    """Pinned keys that reached the front of the queue (held, not queued)."""
    _expiry: list = attrs.field(factory=list)
    """``(until, sequence, key)`` of each pin, lazily dropped once stale."""
    _farthest: list = attrs.field(factory=list)
    """``(-until, -sequence, key)`` of each pin: the farthest predicted return on top."""
    _seq: int = 0
    book: _TenantPins = attrs.field(factory=_TenantPins)
    """Who made each pin (each tenant's share of the pinned budget)."""

    @classmethod
    def following(cls, lru: _LRUShadow, weights: dict) -> _PinnedLRUShadow:
        """A pinned shadow holding what ``lru`` holds, in its order, with its decayed hits,
        sharing the pinned budget among tenants by ``weights``."""
        return cls(held=set(lru._held), queue=OrderedDict(lru._queue), score=lru.score,
                   book=_TenantPins(weights=weights))

    def access(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """As `_LRUShadow.access`; a pinned key loses its pin."""
        if key in self._pinned:
            self._unhold(key)
        _LRUShadow.access(self, key, parent, capacity)

    def _unhold(self, key: Hashable) -> None:
        """``key``'s pin ends; a parked key goes back to the front of the queue."""
        del self._pinned[key]
        self.book.drop(key)
        if key in self._parked:
            self._parked.remove(key)
            self._queue[key] = None
            self._queue.move_to_end(key, last=False)

    def release(self, key: Hashable, parent: Hashable | None, capacity: float) -> None:
        """As `_LRUShadow.release`; a parked key is accessed first (losing its pin)."""
        if key in self._parked:
            self.access(key, parent, capacity)
        _LRUShadow.release(self, key, parent, capacity)

    def trim(self, capacity: float) -> None:
        """Evict until at most ``capacity`` keys are cached: queued keys first (a pinned one
        at the front is parked instead), then parked ones, the farthest return first."""
        held, queue, pinned, farthest = self._held, self._queue, self._pinned, self._farthest
        parked = self._parked
        while len(held) > capacity:
            if queue:
                key = queue.popitem(last=False)[0]
                if key in pinned:
                    parked.add(key)
                else:
                    held.remove(key)
            elif parked:
                until, seq, key = heapq.heappop(farthest)
                if pinned.get(key) == (-until, -seq) and key in parked:
                    del pinned[key]
                    self.book.drop(key)
                    parked.remove(key)
                    held.remove(key)
            else:
                break

    def pin(self, keys: Sequence[Hashable], until: float, limit: int,
            tenant: str | None = None) -> None:
        """Pin ``tenant``'s evictable ``keys`` until ``until`` (a pinned one again), head
        first, within ``tenant``'s share of ``limit`` pins (`_TenantPins.admit`)."""
        pinned, queue, book = self._pinned, self._queue, self.book
        for key in keys:
            if key not in pinned:
                if key not in queue:
                    continue
                admitted, victim = book.admit(tenant, limit)
                if not admitted:
                    continue
                if victim is not None:
                    self._unhold(victim)
                book.add(key, tenant)
            self._seq += 1
            self._hold(key, until, self._seq)

    def _hold(self, key: Hashable, until: float, seq: int) -> None:
        """Record ``key``'s pin ``(until, seq)`` and push it onto both heaps."""
        self._pinned[key] = (until, seq)
        heapq.heappush(self._expiry, (until, seq, key))
        _push_farthest(self._farthest, (-until, -seq, key), self._pinned)

    def expire(self, now: float) -> None:
        """Pins that ran out by ``now`` end; parked keys go back to the front of the queue."""
        expiry, pinned = self._expiry, self._pinned
        while expiry and expiry[0][0] <= now:
            until, seq, key = heapq.heappop(expiry)
            if pinned.get(key) == (until, seq):
                self._unhold(key)

    def restricted(self, keep: Callable[[Hashable], bool]) -> _PinnedLRUShadow:
        """A new shadow holding the kept keys of this one, in the same order, pins kept
        (no counts)."""
        shadow = _PinnedLRUShadow(
            held={key for key in self._held if keep(key)},
            queue=OrderedDict((key, None) for key in self._queue if keep(key)),
            book=_TenantPins(weights=self.book.weights))
        for key, (until, seq) in self._pinned.items():
            if keep(key):
                shadow._hold(key, until, seq)
                shadow.book.add(key, self.book.owner(key))
        shadow._parked = {key for key in self._parked if keep(key)}
        shadow._seq = self._seq
        return shadow

    def check_invariants(self) -> None:
        """Assert `_LRUShadow`'s invariants, that pinned keys are cached, and that parked
        keys are pinned and not queued."""
        super().check_invariants()
        assert all(key in self._held for key in self._pinned)
        assert all(key in self._pinned and key not in self._queue for key in self._parked)
        self.book.check_invariants(self._pinned)


@attrs.define(eq=False, kw_only=True)
class DuelingSLRU(SegmentedLRU):
    """Never far below LRU: evicts as `SegmentedLRU` while a shadow SLRU out-hits a shadow
    LRU over the last ``window_accesses`` (decayed), else as LRU; O(1) amortised per call.

    The hot paths call `SegmentedLRU`'s methods by name: ``super()`` costs as much as the
    call itself in Python 3.11.

    Guarantees (besides `SegmentedLRU`'s segment rules): while `mode` is ``"lru"`` PROTECTED
    is empty after each release, so keys are evicted uncached, orphans, then in release
    order. `mode` is ``"slru"`` until the shadows have seen an eviction and whenever the SLRU
    shadow's decayed hits are at least the LRU shadow's; it turns ``"lru"`` only once the LRU
    shadow leads by more than ``switch_margin_hits``. With judged session pins, no turn is
    pinned until the pinned shadow has led the LRU shadow by more than ``switch_margin_hits``,
    nor after the LRU shadow has led it by as much.
    """

    window_accesses: float = attrs.field(default=20_000.0, validator=attrs.validators.gt(0))
    """Decay horizon of the shadows' hit counts, in accesses (acquires and new blocks)."""
    shadow_sample: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    """At most, the shadows see one key in ``shadow_sample`` (by hash) and are that much
    smaller: set dueling on sampled sets, at 1 / ``shadow_sample`` of the cost. One in 8
    switched to LRU later on the held-out ``agent-swe-busy`` trace (0.39 points below LRU at
    3,000 blocks, against 0.10 with one in 4)."""
    switch_margin_hits: float = attrs.field(default=20.0, validator=attrs.validators.ge(0))
    """The LRU shadow must lead by more than this many decayed (sampled) hits for the order
    to turn into LRU, which empties PROTECTED; it turns back as soon as the SLRU shadow
    leads again (that costs nothing). Hysteresis against flips on a tie: on the Mooncake
    conversation trace they cost 0.5-0.7 points at 4,000-8,000 blocks."""
    sample_from_blocks: int = attrs.field(default=2048, validator=attrs.validators.ge(1))
    """The sample rate is fixed at the first eviction: ``shadow_sample`` for a cache of at
    least this many blocks, else 1 (sampled shadows of smaller caches ran the order up to 2.6
    points below LRU on ``agent-bfcl``, and 0.45 on ``mooncake-synthetic`` at 2,000)."""
    _sample: int = attrs.field(init=False, repr=False, default=1)

    _lru: _LRUShadow = attrs.field(init=False, repr=False, factory=_LRUShadow)
    _slru: _OrderShadow = attrs.field(init=False, repr=False, factory=_OrderShadow)
    _capacity: float = attrs.field(init=False, repr=False, default=math.inf)
    """Cached keys the shadows may hold: the most the real order tracked at an eviction."""
    _switches: int = attrs.field(init=False, repr=False, default=0)
    _lru_mode: bool = attrs.field(init=False, repr=False, default=False)

    session_pins: SessionPins | None = None
    """Keep a finished turn's blocks for its session's next turn (`SessionHints`); ``None``: off."""
    _gaps: SessionGaps | None = attrs.field(init=False, repr=False, default=None)
    _pin_heap: list = attrs.field(init=False, repr=False, factory=list)
    """``(until, sequence, key)`` of each pin, lazily dropped once stale."""
    _pinned_until: dict = attrs.field(init=False, repr=False, factory=dict)
    """Pinned key -> ``(until, sequence)`` of its latest pin."""
    _pin_seq: int = attrs.field(init=False, repr=False, default=0)
    _far_heap: list = attrs.field(init=False, repr=False, factory=list)
    """``(-until, -sequence, key)`` of each pin: the farthest predicted return on top."""
    _pinned_lru: _PinnedLRUShadow | None = attrs.field(init=False, repr=False, default=None)
    """The LRU shadow's twin that pins as the real order would (`SessionPins.judged`),
    made at the first turn of a session."""
    _pins_on: bool = attrs.field(init=False, repr=False, default=False)
    """Whether judged pins are made now: once the pinned shadow leads the LRU shadow by more
    than ``switch_margin_hits``, until the LRU shadow leads it by as much."""
    _book: _TenantPins = attrs.field(init=False, repr=False, factory=_TenantPins)
    """Who made each pin (each tenant's share of the pinned budget)."""
    _tenants: dict = attrs.field(init=False, repr=False, factory=dict)
    """Tenants whose turns were seen; with two or more, pins are judged per tenant."""
    _tenant_of_key: OrderedDict = attrs.field(init=False, repr=False, factory=OrderedDict)
    """Sampled key -> the tenant whose prompt used it last (bounded), once there are two."""
    _tenant_scores: dict = attrs.field(init=False, repr=False, factory=dict)
    """Tenant -> ``[LRU shadow, pinned shadow]`` hits on its keys, decayed by ``_norm``."""
    _norm: float = attrs.field(init=False, repr=False, default=1.0)
    """The decay since the scores' base: a score is its stored value times ``_norm``."""
    _pins_on_for: set = attrs.field(init=False, repr=False, factory=set)
    """With two tenants or more: those whose judged pins are made now (`_pins_on`, per
    tenant, on the shadows' hits on that tenant's keys)."""

    def __attrs_post_init__(self) -> None:
        if self.session_pins is not None:
            self._gaps = SessionGaps(config=self.session_pins)
            self._book.weights = dict(self.session_pins.tenant_weights)

    @property
    def mode(self) -> str:
        """``"slru"`` or ``"lru"``: how the real order evicts now."""
        return "lru" if self._lru_mode else "slru"

    def acquire(self, key: Hashable) -> None:
        """As `SegmentedLRU.acquire`; both shadows see an access of ``key``; a pinned key
        loses its pin, and a hit on one held in PINNED (or in WANTED since) counts in
        ``pin_hits``."""
        if key in self._pinned_until:  # its pin ends; a hit the pin bought if it was parked
            segment = self.segment_of(key)  # (or one a waiting request wanted since)
            if segment is not None and segment >= _PINNED:
                self._counts["pin_hits"] += 1
            del self._pinned_until[key]
            self._book.drop(key)
        SegmentedLRU.acquire(self, key)
        if not hash(key) % self._sample:
            self._observe(key, self._entries[key].parent, release=False)

    def release(self, key: Hashable, parent: Hashable | None = None, *,
                protect: bool = False) -> None:
        """As `SegmentedLRU.release`; a sampled key is an access of both shadows (unless
        they had it in use)."""
        SegmentedLRU._release(self, key, parent, protect=protect)  # without `_release`'s frame
        if not hash(key) % self._sample:
            self._observe(key, parent, release=True)

    def _release(self, key: Hashable, parent: Hashable | None, *, protect: bool = False,
                 cancelled: bool = False) -> None:
        SegmentedLRU._release(self, key, parent, protect=protect, cancelled=cancelled)
        if not hash(key) % self._sample:
            self._observe(key, parent, release=True)

    def evict(self) -> Hashable:
        """As `SegmentedLRU.evict`; the shadows' capacity follows the real cache's."""
        if self._capacity == math.inf:  # the cache is full: fix the sample rate
            self._capacity = float(len(self._entries))
            self._sample = (self.shadow_sample if len(self._entries) >= self.sample_from_blocks
                            else 1)
            if self._sample > 1:  # go on with the sampled keys of what the shadows hold
                sample = self._sample
                self._lru = self._lru.restricted(lambda key: not hash(key) % sample)
                self._slru = self._slru.restricted(lambda key: not hash(key) % sample)
                if self._pinned_lru is not None:
                    self._pinned_lru = self._pinned_lru.restricted(
                        lambda key: not hash(key) % sample)
        elif len(self._entries) > self._capacity:
            self._capacity = float(len(self._entries))
        if self._pinned_until:
            self._park_pinned()
        pinned = self._segments[_PINNED]
        if pinned and len(pinned) + len(self._segments[_WANTED]) == len(self):
            # only pins (and blocks waiting requests want) left: the farthest return goes
            pinned.move_to_end(self._farthest_pin(), last=False)
        key = SegmentedLRU.evict(self)
        if self._pinned_until.pop(key, None) is not None:
            self._book.drop(key)
        return key

    def _park_pinned(self) -> None:
        """Move the pinned keys at the front of the segments evicted next (PROBATION, then
        PROTECTED) to PINNED, until the next victim is not a pinned key: O(1) amortised,
        each pin is parked at most once."""
        pinned_until, entries = self._pinned_until, self._entries
        for segment in self._segments[:_PINNED]:
            while segment:
                key = next(iter(segment))
                if key not in pinned_until or entries[key].segment not in (_PROBATION,
                                                                           _PROTECTED):
                    return
                del segment[key]
                self._put(key, entries[key], _PINNED)

    def discard(self, key: Hashable) -> None:
        """As `SegmentedLRU.discard`; a pin of ``key`` goes too."""
        super().discard(key)
        if self._pinned_until.pop(key, None) is not None:
            self._book.drop(key)

    # -- session pins -----------------------------------------------------------

    def wants_turn(self, session_id: str | None) -> bool:
        """Whether pins are on and the request has a ``session_id`` (or ``prefix_sessions``)."""
        return self.session_pins is not None and (session_id is not None
                                                  or self.session_pins.prefix_sessions)

    def turn_started(self, session_id: str | None, keys: Sequence[Hashable], now: float,
                     tenant: str | None = None) -> Hashable:
        """A request of ``tenant`` with prompt blocks ``keys`` arrived at ``now``: expire
        pins, learn its session's gap; returns the session (``None`` with pins off or no
        session known)."""
        if self._gaps is None:
            return None
        self._expire(now)
        if self._pinned_lru is not None:
            self._pinned_lru.expire(now)
        if tenant is not None:
            self._seen(tenant, keys)
        session = self._gaps.session_of(session_id, keys, tenant)
        if session is not None:
            self._gaps.started(session, now)
        return session

    def turn_finished(self, session: Hashable, keys: Sequence[Hashable], now: float) -> int:
        """``session``'s request released ``keys`` (its prompt's blocks, in chain order) at
        ``now``: pin the evictable ones, tail first, for its predicted gap; returns how many."""
        if self._gaps is None or session is None:
            return 0
        self._expire(now)
        until = self._gaps.finished(session, keys[-1] if keys else None, now)
        tenant = session_tenant(session)
        if self.session_pins.judged:
            self._pin_shadow(keys, until, now, tenant)
        pinned_until, book = self._pinned_until, self._book
        limit = int(self.session_pins.max_pinned_fraction * min(self._capacity, self.tracked)
                    ) if self._pins_wanted(tenant) else 0
        pinned = 0
        for key in keys:  # head first: a pinned prefix hits even if its tail was not pinned
            segment = self.segment_of(key)
            if segment not in (Segment.PROBATION, Segment.PROTECTED, Segment.PINNED):
                continue
            if key not in pinned_until:
                admitted, victim = book.admit(tenant, limit)
                if not admitted:
                    self._counts["pins_refused"] += 1
                    continue
                if victim is not None:  # over its share: its oldest pin ends
                    self._end_pin(victim)
                book.add(key, tenant)
            self._pin_seq += 1
            pinned_until[key] = (until, self._pin_seq)
            heapq.heappush(self._pin_heap, (until, self._pin_seq, key))
            _push_farthest(self._far_heap, (-until, -self._pin_seq, key), pinned_until)
            pinned += 1
        self._counts["pins"] += pinned
        return pinned

    def _pin_shadow(self, keys: Sequence[Hashable], until: float, now: float,
                    tenant: str | None) -> None:
        """Pin ``keys``' sampled ones in the pinned shadow (made now if this is the first
        turn), as the real order would with pins on."""
        shadow = self._pinned_lru
        if shadow is None:
            shadow = self._pinned_lru = _PinnedLRUShadow.following(self._lru,
                                                                   self._book.weights)
        shadow.expire(now)
        sample = self._sample
        limit = int(self.session_pins.max_pinned_fraction
                    * min(self._capacity / sample, len(shadow._held)))
        shadow.pin([key for key in keys if not hash(key) % sample], until, limit, tenant)

    def pins_by_tenant(self) -> dict[str | None, int]:
        """Blocks holding a pin, by the tenant charged for them (None: tenant unknown)."""
        return self._book.counts()

    def _seen(self, tenant: str, keys: Sequence[Hashable]) -> None:
        """A turn of ``tenant`` with prompt blocks ``keys``: with two tenants or more, its
        sampled keys are attributed to it for the per-tenant judge (the first tenant keeps
        the pins the fleet-wide judge had made, each later one starts without)."""
        tenants = self._tenants
        if tenant not in tenants:
            if len(tenants) == 1 and self._pins_on:
                self._pins_on_for.add(next(iter(tenants)))
            tenants[tenant] = None
        if len(tenants) < 2:
            return
        sample, owners = self._sample, self._tenant_of_key
        for key in keys:
            if not hash(key) % sample:
                owners[key] = tenant
                owners.move_to_end(key)
        while len(owners) > 4 * len(self._entries) + 1024:
            owners.popitem(last=False)

    def pinned(self, key: Hashable) -> bool:
        """Whether ``key`` holds a pin: in its place in the order, or held in PINNED past the
        front of its segment."""
        return key in self._pinned_until

    def _pins_wanted(self, tenant: str | None = None) -> bool:
        """Whether a finished turn of ``tenant`` is pinned now: always unless pins are
        judged, then only while the pinned shadow leads (`_pins_on`), on the tenant's own
        keys once two tenants or more were seen."""
        if not self.session_pins.judged:
            return True
        if tenant is not None and len(self._tenants) > 1:
            return tenant in self._pins_on_for
        return self._pins_on

    def _expire(self, now: float) -> None:
        heap = self._pin_heap
        while heap and heap[0][0] <= now:
            until, seq, key = heapq.heappop(heap)
            if self._pinned_until.get(key) == (until, seq):
                segment = self.segment_of(key)
                self._end_pin(key)
                if segment in (Segment.PROBATION, Segment.PROTECTED, Segment.PINNED):
                    self._counts["pins_expired"] += 1

    def _farthest_pin(self) -> Hashable:
        """The pinned key of the latest predicted return (the deepest of its chain), or a
        pinned descendant of it, so that no pinned child outlives its parent."""
        heap = self._far_heap
        while True:
            until, seq, key = heap[0]
            if (self._pinned_until.get(key) == (-until, -seq)
                    and self._entries[key].segment is Segment.PINNED):  # not WANTED since
                break
            heapq.heappop(heap)
        descended = True
        while descended:
            descended = False
            for child in self._entries[key].children:
                if self._entries[child].segment is Segment.PINNED:
                    key, descended = child, True
                    break
        return key

    def _end_pin(self, key: Hashable) -> None:
        """``key``'s pin is over. If it was parked in PINNED it goes to the front of
        PROBATION (its pin kept it past there) and ages normally from there; else it is
        still in its place, orphaned, or wanted by a waiting request."""
        del self._pinned_until[key]
        self._book.drop(key)
        if self.segment_of(key) is Segment.PINNED:
            del self._segments[Segment.PINNED][key]
            self._put(key, self._entries[key], _PROBATION, front=True)

    def _observe(self, key: Hashable, parent: Hashable | None, *, release: bool) -> None:
        """A sampled ``key`` was accessed: judge pins, feed both shadows, follow the leader."""
        sample = self._sample
        if parent is not None and hash(parent) % sample:
            parent = None  # not in the shadows: the prefix rule is checked on sampled keys
        decay = 1.0 - sample / self.window_accesses
        capacity = self._capacity / sample
        lru, slru = self._lru, self._slru  # unrolled: a loop over the two costs a tuple
        lru_hits = lru.hits
        lru.score *= decay
        slru.score *= decay
        if release:
            lru.release(key, parent, capacity)
            slru.release(key, parent, capacity)
        else:
            lru.access(key, parent, capacity)
            slru.access(key, parent, capacity)
        if self._lru_mode:
            lru_mode = lru.score > slru.score
        else:
            lru_mode = lru.score > slru.score + self.switch_margin_hits
        if lru_mode != self._lru_mode:
            self._lru_mode = lru_mode
            self._switches += 1
        pinned = self._pinned_lru
        if pinned is not None:
            pinned_hits = pinned.hits
            pinned.score *= decay
            if release:
                pinned.release(key, parent, capacity)
            else:
                pinned.access(key, parent, capacity)
            if self._tenant_of_key:
                self._judge_tenant(key, decay, lru.hits - lru_hits, pinned.hits - pinned_hits)
            if self._pins_on:
                if lru.score > pinned.score + self.switch_margin_hits:
                    self._pins_on = False
                    self._counts["pin_pauses"] += 1
            elif pinned.score > lru.score + self.switch_margin_hits:
                self._pins_on = True

    def _judge_tenant(self, key: Hashable, decay: float, lru_hit: int, pinned_hit: int) -> None:
        """Per-tenant judge: the shadows' decayed hits on the keys of ``key``'s tenant; its
        pins are made once the pinned shadow leads by more than ``switch_margin_hits``, until
        the LRU shadow leads by as much (the fleet-wide rule on that tenant's keys)."""
        self._norm *= decay
        tenant = self._tenant_of_key.get(key)
        if tenant is not None:
            scores = self._tenant_scores.setdefault(tenant, [0.0, 0.0])
            scores[0] += lru_hit / self._norm
            scores[1] += pinned_hit / self._norm
            lru, pinned = scores[0] * self._norm, scores[1] * self._norm
            margin = self.switch_margin_hits
            if tenant in self._pins_on_for:
                if lru > pinned + margin:
                    self._pins_on_for.discard(tenant)
                    self._counts["pin_pauses"] += 1
            elif pinned > lru + margin:
                self._pins_on_for.add(tenant)
        if self._norm < 1e-100:  # rebase before the stored values overflow
            for scores in self._tenant_scores.values():
                scores[0] *= self._norm
                scores[1] *= self._norm
            self._norm = 1.0

    def _protected_limit(self) -> int:
        return 0 if self._lru_mode else SegmentedLRU._protected_limit(self)

    def duel_stats(self) -> dict[str, float]:
        """The shadows' hits (total and decayed), how often the mode switched, and whether
        pins are made now."""
        return {"shadow_accesses": self._lru.accesses,
                "lru_shadow_hits": self._lru.hits, "slru_shadow_hits": self._slru.hits,
                "lru_shadow_score": self._lru.score, "slru_shadow_score": self._slru.score,
                "mode_switches": self._switches, "lru_mode": int(self._lru_mode),
                "pinned_shadow_hits": 0 if self._pinned_lru is None else self._pinned_lru.hits,
                "pins_on": int(self._pins_wanted()) if self.session_pins else 0}

    def stats(self) -> EvictionStats:
        """`SegmentedLRU.stats` of the real order (the shadows are in `duel_stats`)."""
        return super().stats()

    def check_invariants(self) -> None:
        """Assert the real order's and both shadows' invariants and that every pin is known."""
        super().check_invariants()
        self._lru.check_invariants()
        self._slru.check_invariants()
        if self._pinned_lru is not None:
            self._pinned_lru.check_invariants()
        for key in self._segments[Segment.PINNED]:
            assert key in self._pinned_until, key
        self._book.check_invariants(self._pinned_until)
