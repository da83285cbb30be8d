"""attrs validators shared by the policies, with the exact messages tests match."""

from __future__ import annotations

import math

import attrs


def finite_non_negative(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    """``0 <= value < inf``."""
    if not 0 <= value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and >= 0, got {value!r}")


def finite_positive(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    """``0 < value < inf``."""
    if not 0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and > 0, got {value!r}")


def at_least(minimum: float):
    """A validator of ``value >= minimum`` (NaN fails)."""

    def check(_instance: object, attribute: attrs.Attribute, value: float) -> None:
        if not value >= minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum}, got {value!r}")

    return check


def int_at_least(minimum: int):
    """A validator of an ``int`` (not a ``bool``) ``>= minimum``."""

    def check(_instance: object, attribute: attrs.Attribute, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


def fraction(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    """``0 <= value <= 1`` (NaN fails)."""
    if not 0 <= value <= 1:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")
