"""`DuelingSLRU`: `SetDueling` with session pins, the order the ``cache`` preset ships.

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
tenant most over its share. Once two tenants were seen, judged pins are judged per tenant:
a tenant's pins are credited with the hits they bought (the pinned shadow's hits on its keys
that the LRU shadow missed) and charged with the hits the space they held cost (the LRU
shadow's hits that the pinned shadow missed, shared among the tenants by the blocks their
pins hold parked), so pins that never pay (sessions that never come back) stay off for their
tenant alone and do not turn off another tenant's.
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
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import ClassVar

import attrs

from policies.kv.eviction.dueling import SetDueling
from policies.kv.eviction.pin_shadows import _PinnedLRUShadow, _push_farthest, _TenantPins
from policies.kv.eviction.segments import Segment
from policies.kv.eviction.sessions import SessionGaps, SessionPins, session_tenant

PROBATION, PROTECTED, PINNED = Segment.PROBATION, Segment.PROTECTED, Segment.PINNED


@attrs.define(eq=False, kw_only=True)
class DuelingSLRU(SetDueling):
    """`SetDueling` that can keep agent sessions' blocks across tool calls (``session_pins``).

    Guarantees (besides `SetDueling`'s): a pin moves no key until the key reaches the front
    of the segment evicted next; pinned blocks hold at most ``max_pinned_fraction`` of the
    cache, each tenant within its share; with judged pins, no turn is pinned until the
    pinned shadow has led the LRU shadow by more than ``switch_margin_hits``, nor after the
    LRU shadow has led it by as much.
    """

    COUNTERS: ClassVar[tuple[str, ...]] = (
        *SetDueling.COUNTERS, "pins", "pin_hits", "pins_expired", "pins_refused", "pin_pauses")

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
    """Tenant -> ``[hits its pins cost, hits its pins bought]`` (`_judge_tenant`), decayed
    by ``_norm``."""
    _norm: float = attrs.field(init=False, repr=False, default=1.0)
    """The decay since the scores' base: a score is its stored value times ``_norm``."""
    _pins_on_for: set = attrs.field(init=False, repr=False, factory=set)
    """With two tenants or more: those whose judged pins are made now (`_pins_on`, per
    tenant, on the shadows' hits on that tenant's keys)."""

    def __attrs_post_init__(self) -> None:
        if self.session_pins is not None:
            self._gaps = SessionGaps(config=self.session_pins)
            self._book.weights = dict(self.session_pins.tenant_weights)

    def acquire(self, key: Hashable) -> None:
        """As `SetDueling.acquire`; a pinned key loses its pin, and a hit on one held in
        PINNED (or in WANTED since) counts in ``pin_hits``."""
        if key in self._pinned_until:  # its pin ends; a hit the pin bought if it was parked
            segment = self.segment_of(key)  # (or one a waiting request wanted since)
            if segment is not None and segment >= PINNED:
                self._counts["pin_hits"] += 1
            del self._pinned_until[key]
            self._book.drop(key)
        SetDueling.acquire(self, key)

    def evict(self) -> Hashable:
        """As `SetDueling.evict`; a pinned key at the front of its segment is held in PINNED
        instead, and PINNED is evicted, farthest predicted return first, only when nothing
        else but WANTED is left."""
        if self._pinned_until:
            self._park_pinned()
        pinned = self._segments[PINNED]
        if pinned and len(pinned) + len(self._segments[Segment.WANTED]) == len(self):
            # only pins (and blocks waiting requests want) left: the farthest return goes
            pinned.move_to_end(self._farthest_pin(), last=False)
        key = SetDueling.evict(self)
        if self._pinned_until.pop(key, None) is not None:
            self._book.drop(key)
        return key

    def _restrict_shadows(self, keep: Callable[[Hashable], bool]) -> None:
        SetDueling._restrict_shadows(self, keep)
        if self._pinned_lru is not None:
            self._pinned_lru = self._pinned_lru.restricted(keep)

    def _park_pinned(self) -> None:
        """Move the pinned keys at the front of the segments evicted next (PROBATION, then
        PROTECTED) to PINNED, until the next victim is not a pinned key: O(1) amortised,
        each pin is parked at most once."""
        pinned_until, entries = self._pinned_until, self._entries
        for segment in self._segments[:PINNED]:
            while segment:
                key = next(iter(segment))
                if key not in pinned_until or entries[key].segment not in (PROBATION,
                                                                           PROTECTED):
                    return
                del segment[key]
                self._put(key, entries[key], PINNED)

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
        heap, wanted = self._far_heap, []
        while True:
            until, seq, key = heap[0]
            if self._pinned_until.get(key) == (-until, -seq):
                if self._entries[key].segment is Segment.PINNED:
                    break
                wanted.append(heapq.heappop(heap))  # WANTED now: its pin may be parked again
                continue
            heapq.heappop(heap)  # a pin hit or expired since
        for entry in wanted:
            heapq.heappush(heap, entry)
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
        if self.segment_of(key) is PINNED:
            self.move(key, PROBATION, front=True)


    def _observed(self, key: Hashable, parent: Hashable | None, release: bool, decay: float,
                  capacity: float, lru_hit: int) -> None:
        """The pinned shadow sees the access too: judge pins against the LRU shadow."""
        pinned = self._pinned_lru
        if pinned is None:
            return
        lru = self._lru
        pinned_hits = pinned.hits
        pinned.score *= decay
        if release:
            pinned.release(key, parent, capacity)
        else:
            pinned.access(key, parent, capacity)
        if self._tenant_of_key:
            self._judge_tenant(key, decay, lru_hit, pinned.hits - pinned_hits)
        if self._pins_on:
            if lru.score > pinned.score + self.switch_margin_hits:
                self._pins_on = False
                self._counts["pin_pauses"] += 1
        elif pinned.score > lru.score + self.switch_margin_hits:
            self._pins_on = True

    def _judge_tenant(self, key: Hashable, decay: float, lru_hit: int, pinned_hit: int) -> None:
        """Per-tenant judge: a tenant's pins are credited with the hits they bought (a hit of
        the pinned shadow on the tenant's keys that the LRU shadow missed) and charged with the
        hits the space they held cost (a hit of the LRU shadow that the pinned shadow missed,
        shared among the tenants by the blocks their pins hold parked now; the key's tenant's
        when none is parked). Its pins are made once its credit leads by more than
        ``switch_margin_hits`` (decayed), until its charges lead by as much."""
        self._norm *= decay
        if pinned_hit != lru_hit:
            if pinned_hit:
                tenant = self._tenant_of_key.get(key)
                if tenant is not None:
                    self._score(tenant, 1, 1.0)
            else:
                parked = self._pinned_lru.parked_by
                if parked:
                    total = sum(parked.values())
                    for tenant, blocks in parked.items():
                        if tenant is not None:
                            self._score(tenant, 0, blocks / total)
                else:
                    tenant = self._tenant_of_key.get(key)
                    if tenant is not None:
                        self._score(tenant, 0, 1.0)
        if self._norm < 1e-100:  # rebase before the stored values overflow
            for scores in self._tenant_scores.values():
                scores[0] *= self._norm
                scores[1] *= self._norm
            self._norm = 1.0

    def _score(self, tenant: str, side: int, amount: float) -> None:
        """Add ``amount`` to ``tenant``'s charges (``side`` 0) or credit (1), and turn its
        pins on or off as they lead."""
        scores = self._tenant_scores.setdefault(tenant, [0.0, 0.0])
        scores[side] += amount / self._norm
        charged, credit = scores[0] * self._norm, scores[1] * self._norm
        margin = self.switch_margin_hits
        if tenant in self._pins_on_for:
            if charged > credit + margin:
                self._pins_on_for.discard(tenant)
                self._counts["pin_pauses"] += 1
        elif credit > charged + margin:
            self._pins_on_for.add(tenant)


    def duel_stats(self) -> dict[str, float]:
        """`SetDueling.duel_stats`, the pinned shadow's hits and whether pins are made now."""
        return {**SetDueling.duel_stats(self),
                "pinned_shadow_hits": 0 if self._pinned_lru is None else self._pinned_lru.hits,
                "pins_on": int(self._pins_wanted()) if self.session_pins else 0}

    def check_invariants(self) -> None:
        """Assert the duel's invariants, the pinned shadow's, and that every pin is known."""
        super().check_invariants()
        if self._pinned_lru is not None:
            self._pinned_lru.check_invariants()
        for key in self.keys_in(PINNED):
            assert key in self._pinned_until, key
        self._book.check_invariants(self._pinned_until)
