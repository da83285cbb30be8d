"""Weighted fair queuing across tenants on token cost, with VTC virtual counters.

The model is the Virtual Token Counter of Sheng et al., "Fairness in Serving
Large Language Models" (OSDI '24). Each tenant ``i`` has a counter ``c_i`` of
the token cost it has been served, divided by its weight ``w_i``:

    cost = input_tokens * input_token_cost + output_tokens * output_token_cost
    c_i += cost / w_i                                   (on every ``charge``)

``select`` serves the backlogged tenant with the lowest counter. When a tenant
goes from idle to backlogged its counter is lifted to at least the *virtual
time* ``V`` (the lowest counter among backlogged tenants, or, while none is
backlogged, the counter of the last one to leave), so time spent idle earns no
credit: the share an idle tenant does not use is borrowed by the others, and
it cannot claim it back when it returns.

Fairness bound. Say every ``select`` is followed by a ``charge`` of at most
``M`` token-cost units to the selected tenant before the next ``select``. Then
every backlogged tenant ``i`` always has ``V <= c_i <= V + M / w_i``:

* a charge only goes to the tenant at ``V`` and adds at most ``M / w_i``;
* ``V`` never decreases (charges raise counters, idle tenants leave the
  minimum, returning ones are lifted to ``>= V``), so the upper bounds of the
  tenants not charged stay valid;
* a returning tenant left with ``c_i <= V_then + M / w_i <= V + M / w_i`` and
  is lifted to ``max(c_i, V)``.

Hence over any interval in which tenants ``i`` and ``j`` are both continuously
backlogged, their services ``S`` (token cost) satisfy:

    |S_i / w_i - S_j / w_j| <= M / w_i + M / w_j

and ``<= M / min(w_i, w_j)`` when their counters were equal at the start (for
instance when both became backlogged while the other was idle or at ``V``).
The bound is tight. If charges lag behind selections (output tokens charged as
they are generated), add to ``M`` the cost a tenant can have in flight but not
yet charged, as in VTC's ``2·M`` bound for batched serving.

Per-tenant budget pools (a cap on a tenant's share or tokens) are not part of
this policy: a share cap either breaks work conservation or makes weights
depend on who is backlogged, which voids the bound above. Quotas belong in the
per-tenant token bucket and admission layers, which can answer 429.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from policies.validators import finite_non_negative, finite_positive


class _FrozenMapping(Mapping):
    """A read-only copy of a mapping that, unlike ``MappingProxyType``, pickles."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping) -> None:
        self._data = dict(data)

    def __getitem__(self, key: object) -> object:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


def _frozen_mapping(value: Mapping) -> Mapping:
    return _FrozenMapping(value)


def _positive_weights(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    for tenant, weight in value.items():
        if not isinstance(tenant, str):
            raise ValueError(f"{attribute.name} keys must be tenant names, got {tenant!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"weight of tenant {tenant!r} must be a number, got {weight!r}")
        if not 0 < weight < math.inf:
            raise ValueError(f"weight of tenant {tenant!r} must be finite and > 0, got {weight!r}")


def _token_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class WFQStats:
    """A snapshot of `WFQ`'s state; every mapping is keyed by tenant and read-only."""

    virtual_time: float
    """``V``: the lowest counter among backlogged tenants (frozen while none is)."""
    backlogged: frozenset[str]
    """Tenants currently backlogged."""
    counters: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    """Virtual counters: token cost served divided by weight, plus lifts."""
    lag_tokens: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    """``counter - virtual_time``; in ``[0, M / weight]`` for backlogged tenants."""
    weights: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    """Weight of every tenant configured or seen."""
    input_tokens: Mapping[str, int] = attrs.field(converter=_frozen_mapping)
    """Prompt tokens charged."""
    output_tokens: Mapping[str, int] = attrs.field(converter=_frozen_mapping)
    """Output tokens charged."""
    service_cost: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    """Token cost charged (not divided by weight)."""
    lifted: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    """Counter added by lifts on return from idle: the idle credit a tenant forfeited."""


@attrs.define(eq=False, kw_only=True)
class WFQ:
    """Weighted fair queuing: backlogged tenants' service per weight stays within ``M / w``.

    See the module docstring for the rules and the bound. The integration
    calls ``on_backlogged`` when a tenant's first request starts waiting,
    ``on_idle`` when its last waiting request leaves the queue, ``select`` to
    pick whose request to serve next, and ``charge`` for the tokens served.
    ``select`` scans the backlogged tenants: O(tenants) a call.

    Guarantees:
        * Work conserving: ``select`` always returns a tenant when one is
          backlogged.
        * Fair within a bound: with charges of at most ``M`` per selection,
          every backlogged tenant's ``lag_tokens`` stays in ``[0, M / w]``.
        * No idle credit: a tenant returning from idle starts at ``V`` or
          above, so it cannot monopolise the engine.
    """

    weights: Mapping[str, float] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=_positive_weights
    )
    """Weight of each named tenant; a tenant's share is proportional to its weight."""
    default_weight: float = attrs.field(default=1.0, validator=finite_positive)
    """Weight of tenants not in ``weights`` (including ``policies.DEFAULT_TENANT``)."""
    input_token_cost: float = attrs.field(default=1.0, validator=finite_non_negative)
    """Cost of one prompt token."""
    output_token_cost: float = attrs.field(default=2.0, validator=finite_non_negative)
    """Cost of one output token (decode is dearer per token than prefill)."""

    _counters: dict[str, float] = attrs.field(init=False, repr=False, factory=dict)
    _backlogged: set[str] = attrs.field(init=False, repr=False, factory=set)
    _idle_virtual_time: float = attrs.field(init=False, repr=False, default=0.0)
    _input_tokens: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _output_tokens: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    _service_cost: dict[str, float] = attrs.field(init=False, repr=False, factory=dict)
    _lifted: dict[str, float] = attrs.field(init=False, repr=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.input_token_cost == 0 and self.output_token_cost == 0:
            raise ValueError("input_token_cost and output_token_cost cannot both be 0")

    # -- queries ------------------------------------------------------------

    def weight(self, tenant: str) -> float:
        """The weight of ``tenant``: configured, else ``default_weight``."""
        return self.weights.get(tenant, self.default_weight)

    def counter(self, tenant: str) -> float:
        """The virtual counter of ``tenant`` (0.0 for a tenant never seen)."""
        return self._counters.get(tenant, 0.0)

    @property
    def virtual_time(self) -> float:
        """``V``: the lowest backlogged counter (while none is, the last one to leave's)."""
        if self._backlogged:
            return min(self._counters[tenant] for tenant in self._backlogged)
        return self._idle_virtual_time

    def is_backlogged(self, tenant: str) -> bool:
        """True between ``on_backlogged(tenant)`` and ``on_idle(tenant)``."""
        return tenant in self._backlogged

    def lag_tokens(self, tenant: str) -> float:
        """``counter(tenant) - virtual_time``, in weighted token cost; for metrics.

        In ``[0, M / weight]`` for a backlogged tenant; negative for an idle
        tenant holding credit that ``on_backlogged`` will discard.
        """
        return self.counter(tenant) - self.virtual_time

    # -- decisions ------------------------------------------------------------

    def select(self, backlogged: Iterable[str] | None = None) -> str:
        """The tenant to serve next: the lowest counter among ``backlogged``, ties by name.

        Args:
            backlogged: the candidates, each of which must be backlogged (a
                subset is fine, e.g. the tenants whose next request fits);
                ``None`` means every backlogged tenant.

        Raises:
            ValueError: if there is no candidate.
            KeyError: if a candidate is not backlogged (``on_backlogged`` was
                not called for it, so it was never lifted).
        """
        candidates = self._backlogged if backlogged is None else set(backlogged)
        if not candidates:
            raise ValueError("select needs at least one backlogged tenant")
        for tenant in candidates:
            if tenant not in self._backlogged:
                raise KeyError(f"tenant {tenant!r} is not backlogged; call on_backlogged first")
        return min(candidates, key=lambda tenant: (self._counters[tenant], tenant))

    # -- events ---------------------------------------------------------------

    def on_backlogged(self, tenant: str) -> None:
        """``tenant`` has requests waiting; lift its counter to at least ``virtual_time``.

        No effect if ``tenant`` is already backlogged.
        """
        if tenant in self._backlogged:
            return
        floor = self.virtual_time
        counter = self._counters.get(tenant, 0.0)
        if counter < floor:
            self._lifted[tenant] = self._lifted.get(tenant, 0.0) + floor - counter
            counter = floor
        self._counters[tenant] = counter
        self._backlogged.add(tenant)

    def on_idle(self, tenant: str) -> None:
        """``tenant`` has no request waiting any more. No effect if it was not backlogged."""
        if tenant not in self._backlogged:
            return
        if len(self._backlogged) == 1:
            self._idle_virtual_time = self._counters[tenant]
        self._backlogged.discard(tenant)

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Account tokens served to ``tenant``: its counter grows by ``cost / weight``.

        Any tenant may be charged, backlogged or not (its running requests keep
        generating after its queue empties).

        Raises:
            ValueError: if a token count is negative or not an integer.
        """
        _token_count("input_tokens", input_tokens)
        _token_count("output_tokens", output_tokens)
        cost = input_tokens * self.input_token_cost + output_tokens * self.output_token_cost
        self._counters[tenant] = self._counters.get(tenant, 0.0) + cost / self.weight(tenant)
        self._input_tokens[tenant] = self._input_tokens.get(tenant, 0) + input_tokens
        self._output_tokens[tenant] = self._output_tokens.get(tenant, 0) + output_tokens
        self._service_cost[tenant] = self._service_cost.get(tenant, 0.0) + cost

    # -- introspection --------------------------------------------------------

    def stats(self) -> WFQStats:
        """A frozen snapshot of counters, lags, weights and tokens served per tenant."""
        tenants = set(self.weights) | set(self._counters)
        virtual_time = self.virtual_time
        return WFQStats(
            virtual_time=virtual_time,
            backlogged=frozenset(self._backlogged),
            counters=dict(self._counters),
            lag_tokens={tenant: c - virtual_time for tenant, c in self._counters.items()},
            weights={tenant: self.weight(tenant) for tenant in tenants},
            input_tokens=dict(self._input_tokens),
            output_tokens=dict(self._output_tokens),
            service_cost=dict(self._service_cost),
            lifted=dict(self._lifted),
        )

    def check_invariants(self) -> None:
        """Assert internal consistency (cheap; for tests and notebooks)."""
        assert self._backlogged <= set(self._counters), "a backlogged tenant has no counter"
        assert all(c >= 0 and math.isfinite(c) for c in self._counters.values())
        assert all(self._counters[t] >= self._idle_virtual_time for t in self._backlogged), (
            "a backlogged tenant is below the virtual time it was lifted to"
        )
        for tenant, counter in self._counters.items():
            served = self._service_cost.get(tenant, 0.0) / self.weight(tenant)
            expected = served + self._lifted.get(tenant, 0.0)
            assert math.isclose(counter, expected, rel_tol=1e-9, abs_tol=1e-9), (
                f"counter of {tenant!r} is {counter}, but service/weight + lifts is {expected}"
            )
            cost = (
                self._input_tokens.get(tenant, 0) * self.input_token_cost
                + self._output_tokens.get(tenant, 0) * self.output_token_cost
            )
            assert math.isclose(self._service_cost.get(tenant, 0.0), cost, rel_tol=1e-9)
