"""Build a `Pipeline` from a mapping of slot -> policy, as JSON, YAML or TOML give it.

Each slot's value is a policy class name (``"QoSRanker"``) or a mapping with the
class under ``class`` and its constructor arguments beside it::

    {"fairness": {"class": "WFQ", "weights": {"gold": 4, "bronze": 1}},
     "ranking": "QoSRanker",
     "admission": {"class": "AdmissionController", "max_waiting": 512}}

Class names are those `policies` exports, or ``package.module:Class`` for any
other class. An argument that is itself such a mapping is built the same way; an
integer for a ``random.Random`` field is its seed (``{"class": "AdmissionController",
"rng": 0}``). Every error names the slot, the class and the field.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Mapping
from typing import Any

import attrs

import policies
from integrations.vllm_v1.config.field_types import type_problem
from integrations.vllm_v1.pipeline import DECLARATIONS, Pipeline

CLASS_KEY = "class"
PLAIN_SLOTS = frozenset({"warming_state_path"})
"""Slots that hold a plain value rather than a policy."""


class PipelineConfigError(ValueError):
    """A pipeline named in configuration cannot be built; the message says where and why."""


def slots() -> list[str]:
    """The slots a mapping may set."""
    return [field.name for field in attrs.fields(Pipeline) if field.name not in DECLARATIONS]


def build_pipeline(mapping: Mapping[str, Any], *, where: str = "pipeline") -> Pipeline:
    """The pipeline ``mapping`` describes (unset slots keep their defaults).

    ``where`` names the mapping in messages (``llm_serving_policies.pipeline``), so an
    error reads ``<where>.<slot>.<field> ...``. Every slot is checked before one error is
    raised: its message holds one line per problem.

    Raises:
        PipelineConfigError: for an unknown slot or class, a bad argument (a value of
            the wrong type names its field), or a pipeline the slots do not make up
            (e.g. quotas without fairness).
    """
    known = slots()
    problems = [f"{where}: unknown pipeline slot {slot!r}: slots are {known}"
                for slot in sorted(set(mapping) - set(known), key=str)]
    values = {}
    for slot, value in mapping.items():
        if slot not in known:
            continue
        try:
            values[slot] = value if slot in PLAIN_SLOTS else _build(value, f"{where}.{slot}")
        except PipelineConfigError as error:
            problems.append(str(error))
    if problems:
        raise PipelineConfigError("\n".join(problems))
    try:
        return Pipeline(**values)
    except (TypeError, ValueError) as error:  # Pipeline's own checks name Pipeline.<slot>
        message = str(error)
        raise PipelineConfigError(where + message.removeprefix("Pipeline") if message
                                  .startswith("Pipeline.") else f"{where}: {message}"
                                  ) from error


def _build(spec: Any, where: str) -> Any:
    if spec is None:
        return None
    if isinstance(spec, str):
        return _instantiate(spec, {}, where)
    if isinstance(spec, Mapping) and CLASS_KEY in spec:
        arguments = {name: _argument(value, f"{where}.{name}")
                     for name, value in spec.items() if name != CLASS_KEY}
        return _instantiate(spec[CLASS_KEY], arguments, where)
    raise PipelineConfigError(f"{where}: expected a class name or a mapping with "
                              f"{CLASS_KEY!r}, got {spec!r}")


def _argument(value: Any, where: str) -> Any:
    if isinstance(value, Mapping) and CLASS_KEY in value:
        return _build(value, where)
    if isinstance(value, list):
        return [_argument(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


def _instantiate(name: object, arguments: dict[str, Any], where: str) -> Any:
    cls = _resolve_class(name, where)
    if attrs.has(cls):
        fields = attrs.fields_dict(cls)
        problems = [f"{where}.{field} must be {what}, got {value!r}"
                    for field, value in arguments.items() if field in fields
                    and (what := type_problem(fields[field].type, value))]
        if problems:
            raise PipelineConfigError("\n".join(problems))
        for field, value in arguments.items():
            if field in fields and fields[field].type in (random.Random, "random.Random") \
                    and isinstance(value, int) and not isinstance(value, bool):
                arguments[field] = random.Random(value)  # a seed
    try:
        return cls(**arguments)
    except (TypeError, ValueError, AttributeError) as error:
        raise PipelineConfigError(f"{where} ({cls.__name__}): {error}") from error


def _resolve_class(name: object, where: str) -> type:
    if not isinstance(name, str) or not name:
        raise PipelineConfigError(f"{where}: {CLASS_KEY} must be a class name, got {name!r}")
    if ":" not in name:
        if name not in policies.__all__ or not isinstance(getattr(policies, name), type):
            raise PipelineConfigError(
                f"{where}: unknown policy class {name!r} (a class `policies` exports, or "
                "'package.module:Class')")
        return getattr(policies, name)
    module_name, attr = name.split(":", 1)
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise PipelineConfigError(f"{where}: cannot import {name!r} ({error})") from error
    if not isinstance(value, type):
        raise PipelineConfigError(f"{where}: {name!r} is not a class")
    return value
