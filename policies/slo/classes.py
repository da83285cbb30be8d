"""SLO classes: their targets, which class a request is judged in, and which classes each
tenant may claim."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from policies.validators import finite_positive
from policies.views import RequestView


@attrs.frozen(kw_only=True)
class SLOTarget:
    """A class's latency targets: first token within ``ttft_s``, then ``tpot_s`` a token."""

    ttft_s: float = attrs.field(validator=finite_positive)
    tpot_s: float = attrs.field(validator=finite_positive)


def validate_targets(_instance: object, attribute: attrs.Attribute, value: Mapping) -> None:
    """An attrs validator: ``value`` maps class names to `SLOTarget`."""
    for cls, target in value.items():
        if not isinstance(cls, str) or not isinstance(target, SLOTarget):
            raise ValueError(f"{attribute.name} must map class names to SLOTarget, got "
                             f"{cls!r}: {target!r}")


@attrs.frozen(kw_only=True)
class ClassGrants:
    """The classes each tenant may be judged in: named tenants' grants, and everyone
    else's (anonymous requests included)."""

    by_tenant: Mapping[str, frozenset[str]] = attrs.field(
        factory=dict, converter=lambda grants: {t: frozenset(c) for t, c in grants.items()})
    others: frozenset[str] | None = attrs.field(
        default=None, converter=attrs.converters.optional(frozenset))
    """The classes of every tenant not in ``by_tenant``; None: every class."""

    def allows(self, tenant: str, slo_class: str) -> bool:
        """Whether ``tenant``'s requests may be judged in ``slo_class``."""
        granted = self.by_tenant.get(tenant, self.others)
        return granted is None or slo_class in granted


def resolve_class(request: RequestView, slos: Mapping[str, SLOTarget],
                  tenant_classes: Mapping[str, str],
                  length_classes: tuple[tuple[int, str], ...],
                  grants: ClassGrants | None = None) -> str | None:
    """The class ``request`` is judged by: its own ``slo_class`` if it has a target, else its
    tenant's class, else the first length class whose bound its prompt is within. A length
    class the tenant is not granted (``grants``) gives way to the tightest granted class
    whose TTFT target is no tighter; None if there is none."""
    if request.slo_class is not None and request.slo_class in slos:
        return request.slo_class
    by_tenant = tenant_classes.get(request.tenant)
    if by_tenant is not None:
        return by_tenant
    for bound, cls in length_classes:
        if request.prompt_tokens <= bound:
            if grants is None or grants.allows(request.tenant, cls):
                return cls
            looser = [(target.ttft_s, name) for name, target in slos.items()
                      if target.ttft_s >= slos[cls].ttft_s
                      and grants.allows(request.tenant, name)]
            return min(looser)[1] if looser else None
    return None


def validate_known_classes(instance: object, attribute: attrs.Attribute, value: object
                           ) -> None:
    """An attrs validator: every class ``value`` names has a target in ``instance.slos``."""
    slos = instance.slos
    names = value.values() if isinstance(value, Mapping) else (
        [cls for _, cls in value] if attribute.name == "length_classes" else value)
    for cls in names:
        if cls not in slos:
            raise ValueError(f"{attribute.name}: class {cls!r} has no target in slos")



def check_class_tables(slos: Mapping[str, SLOTarget], *,
                       length_classes: tuple[tuple[int, str], ...] = (),
                       tenant_classes: Mapping[str, str] | None = None,
                       protected_classes: frozenset[str] = frozenset(),
                       demotions: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` naming the table and class when a class the tables name has no
    target in ``slos``."""
    for bound, cls in length_classes:
        if cls not in slos:
            raise ValueError(f"length_classes: class {cls!r} (prompts up to {bound}) has "
                             "no target in slos")
    for name in (*(tenant_classes or {}).values(), *protected_classes):
        if name not in slos:
            raise ValueError(f"class {name!r} (tenant_classes / protected_classes) has no "
                             "target in slos")
    for cls, lower in (demotions or {}).items():
        if lower not in slos:
            raise ValueError(f"demotions[{cls!r}] = {lower!r} has no target in slos")
