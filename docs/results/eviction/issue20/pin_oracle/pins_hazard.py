import sys, bisect, math, heapq
from collections import deque
import attrs
from benchmarks.replay.workloads import load_workload
from benchmarks.cache_replay.simulate import replay_order
from policies.adaptive_eviction import DuelingSLRU
from policies.eviction import Segment
from policies.session_retention import SessionPins

@attrs.define(eq=False, kw_only=True)
class HazardPins(DuelingSLRU):
    horizon_mode: str = "fixed"
    horizon_s: float = 5.0
    window: int = 512
    _gap_sorted: list = attrs.field(init=False, factory=list)
    _gap_fifo: deque = attrs.field(init=False, factory=deque)
    _sess_end: dict = attrs.field(init=False, factory=dict)
    _key_sess: dict = attrs.field(init=False, factory=dict)
    _now: float = attrs.field(init=False, default=0.0)
    _evict_ages: deque = attrs.field(init=False, factory=lambda: deque(maxlen=256))
    _rel_time: dict = attrs.field(init=False, factory=dict)

    def turn_started(self, session_id, keys, now):
        self._now = now
        s = DuelingSLRU.turn_started(self, session_id, keys, now)
        if s is not None and s in self._sess_end:
            gap = now - self._sess_end[s]
            bisect.insort(self._gap_sorted, gap); self._gap_fifo.append(gap)
            if len(self._gap_fifo) > self.window:
                old = self._gap_fifo.popleft(); del self._gap_sorted[bisect.bisect_left(self._gap_sorted, old)]
        return s

    def turn_finished(self, session, keys, now):
        self._now = now
        if session is None: return 0
        self._sess_end[session] = now
        n = DuelingSLRU.turn_finished(self, session, keys, now)
        for k in keys:
            if k in self._pinned_until: self._key_sess[k] = session
        return n

    def _S(self, e):
        g = self._gap_sorted
        if not g: return 1.0
        return (len(g) - bisect.bisect_right(g, e)) / len(g)

    def _R(self, session):
        e = self._now - self._sess_end.get(session, self._now)
        s = self._S(e)
        if s <= 0: return 0.0
        return 1.0 - self._S(e + self.horizon_s) / s

    def _farthest_pin(self):
        pinned = self._segments[Segment.PINNED]
        best, bestR = None, None
        cache = {}
        for key in pinned:
            s = self._key_sess.get(key)
            r = cache.get(s)
            if r is None:
                r = cache[s] = self._R(s) if s is not None else 0.0
            if bestR is None or r < bestR:
                best, bestR = key, r
        key = best
        descended = True
        while descended:
            descended = False
            for child in self._entries[key].children:
                if self._entries[child].segment is Segment.PINNED:
                    key, descended = child, True
                    break
        return key

tr = load_workload(sys.argv[1], max_requests=3000)
chains=[r.block_hashes for r in tr.requests]
turns=[(r.session_id, r.arrival_s) for r in tr.requests]
sizes=[int(x) for x in sys.argv[2].split(",")]
for frac in (0.5, 1.0):
  for slack in (1.5, 3.0):
    for H in (2.0, 5.0, 10.0):
      row=[]
      for size in sizes:
        o=HazardPins(session_pins=SessionPins(max_pinned_fraction=frac, gap_slack=slack), horizon_s=H)
        r=replay_order(chains,size,o,"x",turns=turns)
        row.append(round(100*r.hit_rate,2))
      print(frac, slack, H, row, flush=True)
