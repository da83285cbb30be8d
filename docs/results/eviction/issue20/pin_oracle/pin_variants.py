"""Throwaway: session-pin variants on a generated agent trace (docs/kv_cache.md, "Why pins
buy little at 250 blocks"). Not part of the product.

    python docs/results/eviction/issue20/pin_oracle/pin_variants.py VARIANT agent-swe 125,250,500

VARIANT: learned (the shipped pins at other fractions / slacks), hazard (the whole cache
pinnable, the pin to go first the session least likely to return within a horizon, from the
learned gap distribution), last-turn-oracle (told which turn is a session's last),
next-arrival-oracle (told each session's next arrival), opt-no-bypass (Belady without
dropping the running request's new blocks). Prints hit rates in %.
"""

import bisect
import itertools
import sys
from collections import deque

import attrs

from benchmarks.cache_replay import simulate
from benchmarks.replay.workloads import load_workload
from policies.kv.eviction import DuelingSLRU, Segment, SessionGaps, SessionPins


@attrs.define(eq=False, kw_only=True)
class HazardPins(DuelingSLRU):
    """Pins ranked by P(return within ``horizon_s`` | not returned yet), learned gaps."""

    horizon_s: float = 5.0
    window: int = 512
    _gaps_sorted: list = attrs.field(init=False, factory=list)
    _gaps_fifo: deque = attrs.field(init=False, factory=deque)
    _session_end: dict = attrs.field(init=False, factory=dict)
    _key_session: dict = attrs.field(init=False, factory=dict)
    _now: float = attrs.field(init=False, default=0.0)

    def turn_started(self, session_id, keys, now):
        self._now = now
        session = DuelingSLRU.turn_started(self, session_id, keys, now)
        if session is not None and session in self._session_end:
            gap = now - self._session_end[session]
            bisect.insort(self._gaps_sorted, gap)
            self._gaps_fifo.append(gap)
            if len(self._gaps_fifo) > self.window:
                old = self._gaps_fifo.popleft()
                del self._gaps_sorted[bisect.bisect_left(self._gaps_sorted, old)]
        return session

    def turn_finished(self, session, keys, now):
        self._now = now
        if session is None:
            return 0
        self._session_end[session] = now
        pinned = DuelingSLRU.turn_finished(self, session, keys, now)
        self._key_session.update((k, session) for k in keys if k in self._pinned_until)
        return pinned

    def _survival(self, elapsed):
        gaps = self._gaps_sorted
        return 1.0 if not gaps else (len(gaps) - bisect.bisect_right(gaps, elapsed)) / len(gaps)

    def _return_chance(self, session):
        elapsed = self._now - self._session_end.get(session, self._now)
        alive = self._survival(elapsed)
        return 0.0 if alive <= 0 else 1.0 - self._survival(elapsed + self.horizon_s) / alive

    def _farthest_pin(self):
        pinned = self._segments[Segment.PINNED]
        chance = {}
        for key in pinned:
            session = self._key_session.get(key)
            if session not in chance:
                chance[session] = 0.0 if session is None else self._return_chance(session)
        victim = min(chance, key=chance.get)
        return self._pinned_leaf(next(k for k in pinned if self._key_session.get(k) == victim))

    def _pinned_leaf(self, key):
        """``key`` or a pinned descendant with no pinned child (a parent outlives its child)."""
        pinned_children = [c for c in self._entries[key].children
                           if self._entries[c].segment is Segment.PINNED]
        return self._pinned_leaf(pinned_children[0]) if pinned_children else key


def oracle_gaps(pins, next_arrival, last_turn_only):
    """SessionGaps whose pin lasts until the turn's real next arrival (or, with
    ``last_turn_only``, ends at once on a session's last turn, else as learned)."""

    @attrs.define(eq=False, kw_only=True)
    class OracleGaps(SessionGaps):
        turn: int = 0

        def finished(self, session, tail, now):
            until = SessionGaps.finished(self, session, tail, now)
            index, self.turn = self.turn, self.turn + 1
            if last_turn_only:
                return until if index in next_arrival else now
            return next_arrival.get(index, now)

    return OracleGaps(config=pins)


def main(variant, trace_name, sizes):
    requests = load_workload(trace_name, max_requests=3000).requests
    chains = [r.block_hashes for r in requests]
    turns = [(r.session_id, r.arrival_s) for r in requests]
    next_arrival, last_index = {}, {}
    for i, r in enumerate(requests):
        if r.session_id in last_index:
            next_arrival[last_index[r.session_id]] = r.arrival_s
        last_index[r.session_id] = i
    if variant == "opt-no-bypass":
        row = []
        for size in sizes:
            order = simulate._OptOrder(chains)
            result = simulate._replay(chains, size, order, "opt",
                                      on_request=lambda i, o=order: setattr(o, "now", i))
            row.append(round(100 * result.hit_rate, 2))
        print(variant, row)
        return
    for fraction, slack in itertools.product((0.5, 1.0), (1.5, 3.0)):
        row = []
        for size in sizes:
            pins = SessionPins(max_pinned_fraction=fraction, gap_slack=slack)
            if variant == "hazard":
                order = HazardPins(session_pins=pins)
            else:
                order = DuelingSLRU(session_pins=pins)
                if variant != "learned":
                    order._gaps = oracle_gaps(pins, next_arrival,
                                              variant == "last-turn-oracle")
            result = simulate.replay_order(chains, size, order, variant, turns=turns)
            row.append(round(100 * result.hit_rate, 2))
        print(variant, fraction, slack, row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")])
