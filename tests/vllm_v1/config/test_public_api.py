"""`policies`' public API: every policy class a preset builds is importable from `policies` by
name (``from policies import X``, as the declarative config names classes), and ``__all__`` is
sorted and names only what the package has."""

import attrs
import pytest

import policies
from integrations.vllm_v1.config.presets import PRESETS, preset

FULL_SLO = {"classes": {"chat": {"ttft_s": 0.5, "tpot_s": 0.05},
                        "batch": {"ttft_s": 20.0, "tpot_s": 0.2}},
            "tenants": {"acme": "chat"}, "protected": ["chat"],
            "demotions": {"chat": "batch"}, "protected_priorities": {"-1": 0.05},
            "preemption": True}


def built_classes(value, found):
    """The classes of ``value`` and, through their constructor arguments, of what it holds."""
    if attrs.has(type(value)):
        found.add(type(value))
        for field in attrs.fields(type(value)):
            if field.init and not field.name.startswith("_"):
                built_classes(getattr(value, field.name), found)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            built_classes(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            built_classes(item, found)
    return found


def preset_classes():
    found = set()
    for name in PRESETS:
        built_classes(preset(name), found)
    built_classes(preset("slo", slo=FULL_SLO), found)
    return sorted((cls for cls in found if cls.__module__.startswith("policies.")),
                  key=lambda cls: cls.__name__)


@pytest.mark.parametrize("cls", preset_classes(), ids=lambda cls: cls.__name__)
def test_every_class_a_preset_builds_is_exported_by_name(cls):
    assert cls.__name__ in policies.__all__
    assert getattr(policies, cls.__name__) is cls


def test_the_walk_reaches_the_classes_nested_in_presets():
    names = {cls.__name__ for cls in preset_classes()}
    assert {"DuelingSLRU", "SessionPins", "ClassGrants", "PathDelays", "SLOAdmission"} <= names


def test_all_is_sorted_unique_and_importable():
    assert policies.__all__ == sorted(policies.__all__)
    assert len(set(policies.__all__)) == len(policies.__all__)
    namespace = {}
    exec(f"from policies import {', '.join(policies.__all__)}", namespace)  # noqa: S102
    assert all(name in namespace for name in policies.__all__)
