"""Per-QoS-class caps on draft tokens that tighten under load.

Speculation spends verification compute and KV slots on tokens that may be rejected. When the
engine is idle that is free; when requests queue or the KV cache fills, those slots belong to
the waiting work. `SpeculationBudget` is the policy the scheduling pipeline consults
(``Pipeline(speculation=...)``) to cap every running request's draft before a step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from policies.validators import at_least, fraction
from policies.views import LoadSnapshot

DEFAULT_CLASS = ""
"""The class of a request that names none."""



def _optional_non_negative(_instance: object, attribute: attrs.Attribute,
                           value: int | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@runtime_checkable
class SpeculationPolicy(Protocol):
    """The most draft tokens a running request may have verified this step
    (`SpeculationBudget`); the ``speculation`` slot of a pipeline."""

    @property
    def reads_load(self) -> bool:
        """Whether `limit` reads ``load`` (the scheduler builds it only then)."""
        ...

    def limit(self, slo_class: str | None, load: LoadSnapshot | None = None) -> int:
        """The draft-token cap for ``slo_class`` (None: the default class) under ``load``."""
        ...


@attrs.frozen(kw_only=True)
class SpeculationBudgetStats:
    """A snapshot of a `SpeculationBudget`."""

    default_max_draft_tokens: int
    limits: tuple[tuple[str, int], ...]
    """``(slo_class, max_draft_tokens)`` overrides, sorted by class."""


@attrs.define(eq=False, kw_only=True, on_setattr=attrs.setters.NO_OP)
class SpeculationBudget:
    """A request's draft never exceeds ``limit(slo_class, load)``.

    The limit is the class's override (`set_limit`) or ``default_max_draft_tokens``; while the
    engine is busy (``kv_usage >= busy_kv_usage`` or more than ``busy_waiting_requests``
    requests waiting), classes outside ``protected_classes`` are further capped at
    ``busy_max_draft_tokens`` (``None``: no load rule). Deterministic given its inputs.
    """

    default_max_draft_tokens: int = attrs.field(default=32, validator=at_least(0))
    """Limit for classes without an override."""
    busy_max_draft_tokens: int | None = attrs.field(default=None,
                                                    validator=_optional_non_negative)
    """Cap for unprotected classes while busy (0 turns their speculation off)."""
    busy_kv_usage: float = attrs.field(default=0.85, validator=fraction)
    """KV-cache usage at or above which the engine counts as busy."""
    busy_waiting_requests: int | None = attrs.field(default=0, validator=_optional_non_negative)
    """More waiting requests than this count as busy (``None``: the queue never does)."""
    protected_classes: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    """Classes the load rule never caps (e.g. ``{"gold"}``)."""
    _limits: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)

    def set_limit(self, slo_class: str, max_draft_tokens: int) -> None:
        """Cap drafts of ``slo_class`` at ``max_draft_tokens`` (0 disables speculation)."""
        if max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens!r}")
        self._limits[slo_class] = max_draft_tokens

    def clear(self, slo_class: str) -> None:
        """Drop the override for ``slo_class`` (no-op without one)."""
        self._limits.pop(slo_class, None)

    @property
    def reads_load(self) -> bool:
        """Whether the load rule is on (``busy_max_draft_tokens`` is set)."""
        return self.busy_max_draft_tokens is not None

    def busy(self, load: LoadSnapshot) -> bool:
        """Whether ``load`` triggers the load rule."""
        return (load.kv_usage >= self.busy_kv_usage
                or (self.busy_waiting_requests is not None
                    and load.waiting_requests > self.busy_waiting_requests))

    def limit(self, slo_class: str | None, load: LoadSnapshot | None = None) -> int:
        """The draft-token cap in force for ``slo_class`` (None: the default class) under
        ``load`` (None: the load rule is not applied)."""
        slo_class = slo_class or DEFAULT_CLASS
        cap = self._limits.get(slo_class, self.default_max_draft_tokens)
        if (self.busy_max_draft_tokens is not None and load is not None
                and slo_class not in self.protected_classes and self.busy(load)):
            cap = min(cap, self.busy_max_draft_tokens)
        return cap

    def stats(self) -> SpeculationBudgetStats:
        """The default and the overrides now."""
        return SpeculationBudgetStats(default_max_draft_tokens=self.default_max_draft_tokens,
                                      limits=tuple(sorted(self._limits.items())))

    def check_invariants(self) -> None:
        """Assert every limit is non-negative."""
        assert self.default_max_draft_tokens >= 0
        assert all(v >= 0 for v in self._limits.values())
