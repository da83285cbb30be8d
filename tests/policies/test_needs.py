"""`Needs`: policies declare what they ask of the scheduler, and each declaration matches
the methods the scheduler will call."""

import importlib
import inspect
import pkgutil

import pytest

import policies
from policies import (
    MLFQ,
    WFQ,
    CacheAwareRanker,
    KVWatermarks,
    LifecycleObserver,
    Needs,
    QoSRanker,
    SLOAdmission,
    needs_of,
)


def policy_classes():
    """Every class defined in ``policies`` (protocols aside)."""
    seen = {}
    for module in pkgutil.walk_packages(policies.__path__, "policies."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if cls.__module__.startswith("policies.") and not getattr(cls, "_is_protocol", False):
                seen[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return sorted(seen.items())


LIFECYCLE = ("on_admitted", "on_first_scheduled", "on_finished")


@pytest.mark.parametrize(("name", "cls"), policy_classes(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_policy_with_lifecycle_methods_declares_it(name, cls):
    has_methods = all(callable(getattr(cls, m, None)) for m in LIFECYCLE)
    declared = getattr(cls, "needs", None)
    if has_methods:
        assert isinstance(declared, Needs) and declared.lifecycle, name
    elif declared is not None:
        assert not declared.lifecycle, name


def test_declared_needs():
    assert SLOAdmission.needs == Needs(lifecycle=True, prefix_hits=True)
    assert needs_of(CacheAwareRanker(base=QoSRanker())) == Needs(load_at_rank=True,
                                                                  prefix_hits=True)
    assert needs_of(KVWatermarks()) == Needs(block_quota=True)
    assert needs_of(MLFQ()) == Needs(lifecycle=True)
    assert needs_of(WFQ()) == Needs()


class Undeclared:
    """A policy written without a declaration: its methods imply its needs."""

    def on_admitted(self, request, now):
        pass

    def on_first_scheduled(self, request, now):
        pass

    def on_finished(self, request, now):
        pass

    def rank_key_under_load(self, request, load):
        return 0.0


def test_undeclared_needs_follow_the_methods():
    assert isinstance(Undeclared(), LifecycleObserver)
    assert needs_of(Undeclared()) == Needs(lifecycle=True, load_at_rank=True)
    assert needs_of(object()) == Needs()


def test_a_declaration_of_the_wrong_type_is_refused():
    class Wrong:
        needs = {"lifecycle": True}

    with pytest.raises(TypeError, match=r"Wrong.needs must be a policies.Needs"):
        needs_of(Wrong())


def test_needs_are_frozen():
    with pytest.raises(AttributeError):
        Needs().lifecycle = True
