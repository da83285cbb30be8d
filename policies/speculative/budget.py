"""A per-QoS-class cap on draft tokens: the hook the scheduling side turns down under load."""

from __future__ import annotations

import attrs


def _non_negative(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class SpeculationBudgetStats:
    """A snapshot of a `SpeculationBudget`."""

    default_max_draft_tokens: int
    limits: tuple[tuple[str, int], ...]
    """``(slo_class, max_draft_tokens)`` overrides, sorted by class."""


@attrs.define(eq=False, kw_only=True, on_setattr=attrs.setters.NO_OP)
class SpeculationBudget:
    """Draft length never exceeds the limit set for the request's class (or the default).

    A controller (for example one reading `LoadSnapshot`) calls `set_limit("bronze", 0)` to turn
    speculation off for a class under load and `clear` to restore the default.
    """

    default_max_draft_tokens: int = attrs.field(default=32, validator=_non_negative)
    """Limit for classes without an override."""
    _limits: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)

    def set_limit(self, slo_class: str, max_draft_tokens: int) -> None:
        """Cap drafts of ``slo_class`` at ``max_draft_tokens`` (0 disables speculation)."""
        if max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens!r}")
        self._limits[slo_class] = max_draft_tokens

    def clear(self, slo_class: str) -> None:
        """Drop the override for ``slo_class`` (no-op without one)."""
        self._limits.pop(slo_class, None)

    def limit(self, slo_class: str) -> int:
        """The draft-token cap in force for ``slo_class``."""
        return self._limits.get(slo_class, self.default_max_draft_tokens)

    def stats(self) -> SpeculationBudgetStats:
        """The default and the overrides now."""
        return SpeculationBudgetStats(default_max_draft_tokens=self.default_max_draft_tokens,
                                      limits=tuple(sorted(self._limits.items())))

    def check_invariants(self) -> None:
        """Assert every limit is non-negative."""
        assert self.default_max_draft_tokens >= 0
        assert all(v >= 0 for v in self._limits.values())
