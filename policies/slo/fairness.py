"""Fair shares between the tenants of one SLO class: admission and order by weight.

`SLOAdmission` and `TTFTDeadlineRanker` serve each class by its first-token deadline, first
come first served. Tenants of one class then share it by how fast they send: one that sends
three times its share fills the admission budget every other tenant of the class counted on.
`ClassFairShare` keeps, per class, what each tenant's admitted requests cost the engine,
and tells the two policies which tenants are over their weighted share:

* **Charge.** A request is charged on admission its uncached prefill (prompt less its
  prefix-cache hit) plus ``decode_token_cost`` per output token it is expected to generate;
  when it finishes, the expected decode is replaced by what it generated. Charges decay
  with a half-life (``half_life_s``), so a tenant's charge is its recent rate of work
  (times ``half_life_s / ln 2``) and history older than a few half-lives is forgotten.
* **Active tenants.** A tenant is active in a class while it has a request admitted and
  unfinished there, and for ``half_life_s`` after its last one finished; one that stays away
  longer is forgotten (its charge with it). Fairness applies among the active tenants of a
  class only, so it is work-conserving: a tenant alone in its class is never held back
  (share 1, no lead), whatever it sends, and weights of absent tenants reserve nothing.
* **Over its share.** With ``D`` the decayed charges and ``w`` the weights of the active
  tenants of a class (the arriving one included), tenant ``i`` is over its share when
  ``D_i / w_i > ΣD / Σw``: its part of the class's recent work exceeds its part of the
  weights. At least one active tenant is never over (the lowest ``D / w`` is at most the mean).
* **Admission share.** A request of a tenant over its share is planned on part of the
  prefill rate (`share`): what the other tenants under their shares have lately used of
  the class's work leaves, ``1 - Σ_{j under} D_j / ΣD``, at least its weighted share
  ``w_i / Σw`` (they used at most theirs). It is admitted only while room is left for
  what the others under their shares send, and their arrivals are served in that room
  (they are ranked before it, and its admitted requests yield to them), while capacity
  they do not use is not held back. A request of a tenant under its share is planned on
  the whole rate. The TPOT test of `SLOAdmission` is not shared: it is one bound on the
  whole batch, and a tenant over its share still fills it first come, first served.
* **Order.** A request of a tenant over its share is served as if it arrived `lead_s`
  later: the time the class, at its recent rate ``ΣD ln 2 / half_life_s``, would need to
  serve the other tenants up to their weighted shares of this one's excess,
  ``(D_i / w_i - ΣD / Σw) · Σw · half_life_s / (ΣD ln 2)`` (a virtual clock), capped by the
  caller (`TTFTDeadlineRanker` caps it at the class's TTFT target, so the deadline order
  across classes moves by at most one target).

Guarantee (checked by property tests). If every charge of at most ``M`` goes to a tenant
that is not over its share, then every active tenant's share of the class's decayed charge
stays within ``[w_i/Σw - (n-1)·M/ΣD, w_i/Σw + M/ΣD]`` (``n`` active tenants): charging one
not over the mean lifts it at most ``M/w_i`` above the mean, and decay scales every charge
alike. Under backlog ``ΣD`` grows to the class's rate times ``half_life_s / ln 2``, so shares
converge to the weights within ``(n-1)·M·ln 2 / (rate · half_life_s)``.

Reads (`share`, `lead_s`, `over_share`) do not change the state, and do not depend on decay
(all charges of a class decay alike): ``now`` only decides which tenants are still active.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from policies.validators import finite_non_negative, finite_positive

DEFAULT_HALF_LIFE_S = 10.0
"""Charges halve every 10 s: shares are judged over the last few tens of seconds, many
first-token targets long, so one burst does not flip who is over."""
_OVER = 1e-9
"""Relative tolerance of `over_share`: equal charges per weight are not over."""


def _weights(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for tenant, weight in value.items():
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"{attribute.name} keys must be non-empty tenant names, got "
                             f"{tenant!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
                0 < weight < math.inf):
            raise ValueError(f"{attribute.name}.{tenant} must be a positive number, got "
                             f"{weight!r}")


@attrs.frozen(kw_only=True)
class ClassFairShareStats:
    """A snapshot of a `ClassFairShare` (every mapping a copy)."""

    shares: Mapping[str, Mapping[str, float]]
    """Class -> active tenant -> its part of the class's decayed charge (0 when none yet)."""
    fair_shares: Mapping[str, Mapping[str, float]]
    """Class -> active tenant -> its weight over the class's active weights."""
    recent_tokens: Mapping[str, float]
    """Class -> its active tenants' decayed charges summed (``ΣD``: the class's recent
    rate of work times ``half_life_s / ln 2``)."""
    charged_tokens: Mapping[str, float]
    """Tenant -> engine tokens charged since the start (uncached prefill plus
    ``decode_token_cost`` per decode token; not decayed)."""
    over_share_admissions: Mapping[str, int]
    """Tenant -> requests admitted while it was over its share in their class (planned on its
    weighted share, served later)."""
    in_flight: int
    """Admitted requests not finished."""


@attrs.define(eq=False, kw_only=True)
class _ClassState:
    """One class's tenants: decayed charges as of ``at_s``, requests in flight, last seen."""

    at_s: float
    charges: dict[str, float] = attrs.field(factory=dict)
    in_flight: dict[str, int] = attrs.field(factory=dict)
    last_s: dict[str, float] = attrs.field(factory=dict)
    """When each tenant last had a request admitted or finished here."""


@attrs.define(eq=False, kw_only=True)
class ClassFairShare:
    """Weighted fair shares between the tenants of each SLO class (see the module docs).

    `SLOAdmission` drives it: `share` and `lead_s` before admitting a request, `on_admitted`
    and `on_finished` after. Memory: the active tenants of each class and the requests in
    flight. O(active tenants of the class) per call.
    """

    weights: Mapping[str, float] = attrs.field(factory=dict, converter=dict,
                                               validator=_weights)
    """Tenant -> weight; a tenant's share of its class is its weight over the active ones'."""
    default_weight: float = attrs.field(default=1.0, validator=finite_positive)
    """The weight of tenants not in ``weights``."""
    half_life_s: float = attrs.field(default=DEFAULT_HALF_LIFE_S, validator=finite_positive)
    """Charges halve every ``half_life_s``; a tenant with nothing in flight for as long is
    no longer active."""
    decode_token_cost: float = attrs.field(default=1.0, validator=finite_non_negative)
    """What one output token is charged, in prefill tokens."""

    _classes: dict[str, _ClassState] = attrs.field(init=False, factory=dict, repr=False)
    _requests: dict[str, tuple[str, str, float, float]] = attrs.field(init=False, factory=dict,
                                                                      repr=False)
    """Request id -> (class, tenant, expected decode charge, when it was charged)."""
    _charged: dict[str, float] = attrs.field(init=False, factory=dict, repr=False)
    _over_admitted: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _now: float = attrs.field(init=False, default=-math.inf, repr=False)
    """The latest time it was told of (for `stats`)."""

    def weight(self, tenant: str) -> float:
        """``tenant``'s weight."""
        return self.weights.get(tenant, self.default_weight)

    # -- reading --------------------------------------------------------------------

    def _active(self, state: _ClassState, now: float) -> list[str]:
        return [tenant for tenant, last in state.last_s.items()
                if state.in_flight.get(tenant, 0) > 0 or now - last <= self.half_life_s]

    def _standing(self, tenant: str, slo_class: str, now: float
                  ) -> tuple[float, float, float]:
        """``(D_i / w_i, ΣD / Σw, the part of ΣD charged to the others not over their
        shares)`` over the active tenants of ``slo_class`` with ``tenant`` among them
        (charges as of the class's last update)."""
        state = self._classes.get(slo_class)
        if state is None:
            return 0.0, 0.0, 0.0
        active = set(self._active(state, now)) | {tenant}
        total_weight = sum(self.weight(t) for t in active)
        total = sum(state.charges.get(t, 0.0) for t in active)
        mean = total / total_weight
        under = sum(state.charges.get(t, 0.0) for t in active if t != tenant
                    and state.charges.get(t, 0.0) / self.weight(t) <= mean * (1 + _OVER))
        return (state.charges.get(tenant, 0.0) / self.weight(tenant), mean,
                under / total if total else 0.0)

    def over_share(self, tenant: str, slo_class: str, now: float) -> bool:
        """Whether ``tenant``'s part of ``slo_class``'s recent work exceeds its weighted share
        among the tenants active there at ``now`` (never when it is alone)."""
        own, mean, _ = self._standing(tenant, slo_class, now)
        return own > mean * (1 + _OVER)

    def share(self, tenant: str, slo_class: str, now: float) -> float:
        """The part of the rate a request of ``tenant`` in ``slo_class`` is planned on: 1 when
        not over its share; else what the other tenants under their shares have lately
        used of the class's work leaves (at least its weight over the class's active
        weights, since they used at most theirs)."""
        own, mean, under = self._standing(tenant, slo_class, now)
        return 1.0 - under if own > mean * (1 + _OVER) else 1.0

    def lead_s(self, tenant: str, slo_class: str, now: float, max_lead_s: float) -> float:
        """How much later than its arrival a request of ``tenant`` in ``slo_class`` is ranked:
        0 when not over its share, else the virtual-clock lead of the module docs, at most
        ``max_lead_s``."""
        own, mean, _ = self._standing(tenant, slo_class, now)
        if not own > mean * (1 + _OVER):
            return 0.0
        mean_life_s = self.half_life_s / math.log(2)
        return min((own - mean) / mean * mean_life_s, max_lead_s)

    # -- lifecycle ------------------------------------------------------------------

    def _advance(self, slo_class: str, now: float) -> _ClassState:
        """The class's state with charges decayed to ``now`` (if later) and tenants that
        stayed away for ``half_life_s`` forgotten."""
        state = self._classes.get(slo_class)
        if state is None:
            state = self._classes[slo_class] = _ClassState(at_s=now)
        if now > state.at_s:
            factor = 0.5 ** ((now - state.at_s) / self.half_life_s)
            for tenant in state.charges:
                state.charges[tenant] *= factor
            state.at_s = now
        active = set(self._active(state, now))
        for tenant in [t for t in state.last_s if t not in active]:
            del state.last_s[tenant]
            state.charges.pop(tenant, None)
            state.in_flight.pop(tenant, None)
        return state

    def _charge(self, state: _ClassState, tenant: str, amount: float, now: float) -> None:
        """Add ``amount`` charged at ``now`` (decayed to the class's time if ``now`` is
        earlier); a negative amount never takes a charge below 0."""
        scaled = amount * 0.5 ** (max(state.at_s - now, 0.0) / self.half_life_s)
        state.charges[tenant] = max(state.charges.get(tenant, 0.0) + scaled, 0.0)
        self._charged[tenant] = self._charged.get(tenant, 0.0) + amount

    def on_admitted(self, request_id: str, tenant: str, slo_class: str, prefill_tokens: int,
                    expected_output_tokens: float, now: float) -> None:
        """Charge an admitted request of ``tenant`` in ``slo_class``: its uncached
        ``prefill_tokens`` plus its expected decode (repeats change nothing).

        Raises:
            ValueError: for a negative token count.
        """
        if prefill_tokens < 0 or expected_output_tokens < 0:
            raise ValueError("prefill_tokens and expected_output_tokens must be >= 0, got "
                             f"{prefill_tokens!r} and {expected_output_tokens!r}")
        if request_id in self._requests:
            return
        if self.over_share(tenant, slo_class, now):
            self._over_admitted[tenant] = self._over_admitted.get(tenant, 0) + 1
        self._now = max(self._now, now)
        state = self._advance(slo_class, now)
        expected = self.decode_token_cost * expected_output_tokens
        self._charge(state, tenant, prefill_tokens + expected, now)
        state.in_flight[tenant] = state.in_flight.get(tenant, 0) + 1
        state.last_s[tenant] = max(state.last_s.get(tenant, now), now)
        self._requests[request_id] = (slo_class, tenant, expected, now)

    def on_finished(self, request_id: str, output_tokens: int, now: float) -> None:
        """``request_id`` finished after ``output_tokens``: its expected decode charge is
        replaced by the real one (a request never admitted here is ignored)."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        slo_class, tenant, expected, charged_s = entry
        self._now = max(self._now, now)
        state = self._advance(slo_class, now)
        self._charge(state, tenant, -expected, charged_s)
        self._charge(state, tenant, self.decode_token_cost * output_tokens, now)
        state.in_flight[tenant] -= 1
        state.last_s[tenant] = max(state.last_s[tenant], now)

    # -- reporting ----------------------------------------------------------------------

    def stats(self) -> ClassFairShareStats:
        """A snapshot as of the latest admission or finish (see `ClassFairShareStats`)."""
        shares, fair, recent = {}, {}, {}
        for slo_class, state in self._classes.items():
            active = self._active(state, self._now)
            if not active:
                continue
            total = sum(state.charges.get(t, 0.0) for t in active)
            total_weight = sum(self.weight(t) for t in active)
            shares[slo_class] = {t: state.charges.get(t, 0.0) / total if total else 0.0
                                 for t in active}
            fair[slo_class] = {t: self.weight(t) / total_weight for t in active}
            recent[slo_class] = total * 0.5 ** (max(self._now - state.at_s, 0.0)
                                                / self.half_life_s)
        return ClassFairShareStats(shares=shares, fair_shares=fair, recent_tokens=recent,
                                   charged_tokens=dict(self._charged),
                                   over_share_admissions=dict(self._over_admitted),
                                   in_flight=len(self._requests))

    def check_invariants(self) -> None:
        """Charges are never negative; requests in flight match the per-tenant counts; every
        tenant with a request in flight is known to its class."""
        counts: dict[tuple[str, str], int] = {}
        for slo_class, tenant, expected, _ in self._requests.values():
            assert expected >= 0
            counts[slo_class, tenant] = counts.get((slo_class, tenant), 0) + 1
        for slo_class, state in self._classes.items():
            assert all(v >= 0 for v in state.charges.values())
            assert set(state.charges) <= set(state.last_s)
            assert set(state.in_flight) <= set(state.last_s)
            for tenant, count in state.in_flight.items():
                assert count == counts.pop((slo_class, tenant), 0)
        assert not counts
