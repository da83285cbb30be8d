"""EDF feasibility, as pure functions: when a request's first token comes under earliest
deadline first on a shared prefill rate, and when KV and slots free up for it.

With EDF on one server, a set of requests meets its deadlines if and only if, for every
request, the prefill work served no later than it is done by its deadline. `edf_lateness` runs
that test for one new request against the admitted ones, sorted by their place in the order
the engine serves them. That place and the deadline tested may differ: the engine ranks by a
class's target while admission may test against a tighter one (a headroom), and a plan that
sorted by the tighter deadlines would not be the order the engine serves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from policies.slo.ledger import RELEASE_QUANTILES

Planned = tuple[float, float, float, str, float]
"""An admitted request with prefill left, as `edf_lateness` plans it: ``(its place in the
order (the engine's rank key), its deadline, its share of the rate, the class it was over its
share in or "", its remaining prefill in context-free tokens)``."""


Arriving = Callable[[float], tuple[float, float]]
"""``within_s`` -> ``(prefill tokens, requests)`` not admitted yet that will arrive in the next
``within_s`` seconds and be served before a request (`TighterArrivals.arriving`)."""
SlotReady = Callable[[int, float], float]
"""``(k, arriving)`` -> when a request gets a running slot with ``k`` admitted, unstarted
requests and ``arriving`` requests still to arrive before it."""
ARRIVAL_PRECISION_S = 1e-3
"""`edf_lateness` finds a request's wait with what arrives ahead of it meanwhile by bisection,
to within this much (never short of it)."""


def edf_lateness(*, now: float, key: float, due: float, share: float, tokens: float,
                 rate: float, step_s: float, items: Sequence[Planned], started: int,
                 slot_ready_s: SlotReady, kv_ready_s: float | None,
                 yielded_in: str, arriving: Arriving | None = None) -> tuple[float, float]:
    """``(lateness of a new request, most lateness it adds to an admitted one due later that
    was on time)`` under EDF; lateness <= 0 is on time.

    The new request is due at ``due``, needs ``tokens`` of prefill and takes its place
    ``key`` in ``items`` (sorted by place; ties go to the admitted request); each request is
    planned on its share of ``rate`` (prefill tokens/s), plus one step of ``step_s``. The
    first ``started`` items hold slots; an unstarted one waits for a slot
    (``slot_ready_s(k, 0)``: when a request with ``k`` unstarted ones before it gets one), one
    more with the new request admitted ahead of it. The new request starts once KV
    (``kv_ready_s``, None: now) and a slot are free. Admitted requests that were over their
    share in class ``yielded_in`` are not protected from it (their share left it that room).

    With ``arriving``, the prefill that arrives while the new request waits and is served
    before it comes first: its wait is the least ``w`` with ``wait(arriving(w)) <= w`` (an
    engine with room serves it before much arrives; a saturated one makes it wait for every
    arrival up to its turn). Those arriving while it waits for a slot take the slots freed
    meanwhile first (``slot_ready_s(k, arriving)``, settled the same way), so an engine whose
    slots are the limit makes it wait as well; once it holds a slot, later arrivals take only
    prefill. It delays the new request only."""
    own_ahead, added, ahead = 0.0, -math.inf, 0.0
    placed, before = False, 0
    for index, (item_key, item_due, item_share, item_over, work) in enumerate(items):
        if not placed and key < item_key:
            placed = True
            own_ahead = ahead
        ahead += work
        before += not placed
        if placed and item_key < math.inf and not (yielded_in and item_over == yielded_in):
            item_rate = rate * item_share
            was = now + ahead / item_rate + step_s - item_due
            late = was + tokens / item_rate
            if index >= started:  # not started: it waits for a slot
                own = work / item_rate + step_s - item_due
                was = max(was, slot_ready_s(index - started, 0.0) + own)
                late = max(late, slot_ready_s(index - started + 1, 0.0) + own)
            if was <= 0 < late:
                added = max(added, late)
    if not placed:
        own_ahead = ahead
    unstarted = max(0, before - started)  # unstarted requests ahead of it want slots too

    arrivals = arriving or _nothing_arriving

    def slot_wait_s(within_s: float) -> float:  # never falls as within_s grows
        return slot_ready_s(unstarted, arrivals(within_s)[1]) - now

    # it starts once KV and a slot are free; what arrives ahead of it takes the slots freed
    # while it waits for one, not those freed once it holds its own
    ready = max(kv_ready_s or now, now + _settled(slot_wait_s, key - now))

    def first_token_s(arrived_tokens: float) -> float:  # its prefill after the work ahead
        done = now + (own_ahead + arrived_tokens + tokens) / (rate * share) + step_s
        return max(done, ready + tokens / (rate * share) + step_s) if ready > now else done

    return now + _settled(lambda within_s: first_token_s(arrivals(within_s)[0]) - now,
                          key - now) - due, added


def _nothing_arriving(_within_s: float) -> tuple[float, float]:
    """`Arriving` without a plan for the requests still to come."""
    return 0.0, 0.0


def _settled(wait_s: Callable[[float], float], horizon_s: float) -> float:
    """The least ``w`` with ``wait_s(w) <= w``, for a wait that never falls as ``w`` grows and
    stops growing past ``horizon_s`` (nothing arriving later ranks ahead): at least the wait
    alone, ``wait_s(inf)`` when no ``w`` up to the horizon settles it; by bisection to within
    `ARRIVAL_PRECISION_S` (never short of it)."""
    low = wait_s(0.0)
    if wait_s(low) <= low:
        return low
    high = max(low, horizon_s)
    if not wait_s(high) <= high:
        return wait_s(math.inf)
    while high - low > ARRIVAL_PRECISION_S:
        middle = (low + high) / 2
        if wait_s(middle) <= middle:
            high = middle
        else:
            low = middle
    return high


def freed_by_s(releases: Sequence[tuple[float, float]], need_tokens: float) -> float:
    """When the ``(when, KV tokens)`` releases, earliest first, have freed ``need_tokens``
    (``inf`` if they cannot)."""
    freed = 0
    for when, tokens in releases:
        freed += tokens
        if freed >= need_tokens - 1e-6:  # shares of a footprint may sum a rounding short
            return when
    return math.inf


def slots_free_s(now: float, slots: float, releases: Sequence[tuple[float, float]],
                 finish_rate_per_s: float, arriving: float = 0.0) -> float:
    """When ``slots`` more slots are free, by the later of two estimates: the admitted
    requests' expected finishes (every `RELEASE_QUANTILES` releases, one slot; ``inf`` if
    they cannot free enough) and the rate at which slots have been freed lately. The
    expected finishes learn from finished requests only, and with every slot taken the
    first to finish are the short ones: on the ``reasoning`` trace, with 256 slots full and
    one request finished, they put the next free slot 0.01 s away where it came 2-5 s
    later. ``arriving`` of the ``slots`` go to requests still to arrive, which free slots of
    their own: the expected finishes bound only the rest."""
    index = math.ceil(slots - arriving) * RELEASE_QUANTILES - 1
    expected = now if index < 0 else releases[index][0] if index < len(releases) else math.inf
    return max(expected, now + slots / finish_rate_per_s)
