"""`Needs`: policies declare what they ask of the scheduler, each declaration matches the
methods the scheduler will call, and a policy that declares nothing gets nothing."""

import importlib
import inspect
import pkgutil

import pytest

import policies
from policies import (
    MLFQ,
    WFQ,
    CacheAwareRanker,
    EDFRanker,
    KVWatermarks,
    LifecycleObserver,
    Needs,
    QoSRanker,
    SLOAdmission,
    needs_of,
)
from policies.needs import NO_NEEDS


def policy_classes():
    """Every class defined in ``policies`` (protocols aside)."""
    seen = {}
    for module in pkgutil.walk_packages(policies.__path__, "policies."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if cls.__module__.startswith("policies.") and not getattr(cls, "_is_protocol", False):
                seen[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return sorted(seen.items())


IMPLIED = {
    "lifecycle": ("on_admitted", "on_first_scheduled", "on_finished"),
    "load_at_rank": ("rank_key_under_load",),
    "block_quota": ("block_quota", "level"),
    "deadlines": ("is_expired", "is_late"),
}
"""The methods the scheduler calls for each need: a class has them exactly when it asks."""


@pytest.mark.parametrize(("name", "cls"), policy_classes(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_policy_declares_exactly_the_needs_its_methods_serve(name, cls):
    declared = getattr(cls, "needs", None)
    if declared is not None:
        assert isinstance(declared, Needs), name
    asks = {need for need in IMPLIED if getattr(declared, need, False)}
    serves = {need for need, methods in IMPLIED.items()
              if all(callable(getattr(cls, m, None)) for m in methods)}
    assert asks == serves, name


def test_declared_needs():
    assert SLOAdmission.needs == Needs(lifecycle=True, prefix_hits=True)
    assert needs_of(CacheAwareRanker(base=QoSRanker())) == Needs(load_at_rank=True,
                                                                  prefix_hits=True)
    assert needs_of(KVWatermarks()) == Needs(block_quota=True)
    assert needs_of(MLFQ()) == Needs(lifecycle=True)
    assert needs_of(EDFRanker()) == Needs(deadlines=True)
    assert needs_of(WFQ()) == Needs()


class Undeclared:
    """A policy with lifecycle and ranking-under-load methods but no declaration."""

    def on_admitted(self, request, now):
        pass

    def on_first_scheduled(self, request, now):
        pass

    def on_finished(self, request, now):
        pass

    def rank_key_under_load(self, request, load):
        return 0.0


def test_a_policy_without_a_declaration_gets_no_needs():
    assert isinstance(Undeclared(), LifecycleObserver)
    assert needs_of(Undeclared()) == Needs() == NO_NEEDS
    assert needs_of(object()) == Needs()


def test_a_declaration_of_the_wrong_type_is_refused():
    class Wrong:
        needs = {"lifecycle": True}

    with pytest.raises(TypeError, match=r"Wrong.needs must be a policies.Needs"):
        needs_of(Wrong())


def test_needs_are_frozen():
    with pytest.raises(AttributeError):
        Needs().lifecycle = True
