"""Name a pipeline in plain vLLM configuration: ``--additional-config``'s ``llm_serving_policies``.

The entry is a mapping; its ``pipeline`` is any of

* a preset name: ``"default"`` (`integrations.vllm_v1.config.presets`);
* an import path: ``"package.module:attr"`` or ``"path/to/file.py:attr"``, naming a
  `Pipeline` or a function that returns one;
* a declarative mapping, slot -> policy (`integrations.vllm_v1.config.declarative`),
  inline or in a ``.json`` / ``.yaml`` / ``.toml`` file named by its path;
* the pickled form `to_additional_config` writes (the transport for a pipeline built
  in Python, e.g. in a notebook; not meant to be written by hand).

``tenant_weights`` (a mapping) is handed to presets that weigh tenants; ``slo`` (a mapping)
declares the ``slo`` preset's classes (`integrations.vllm_v1.config.slo`). Other keys
of the entry belong to the serving layer (see `integrations.vllm_v1.serving`) and to
hooks (``hooks``: import paths of extra `SchedulerHook` factories).

    vllm serve MODEL --scheduler-cls integrations.vllm_v1.scheduling.scheduler.PolicyScheduler \\
        --middleware integrations.vllm_v1.serving.middleware.PolicyMiddleware \\
        --additional-config '{"llm_serving_policies": {"pipeline": "default"}}'

(``integrations.vllm_v1.scheduling.scheduler.AsyncPolicyScheduler`` under asynchronous
scheduling, vLLM's GPU default.) With our entry declared, the vLLM plugin
(`integrations.vllm_v1.plugin`) checks it all at once before the engine starts and turns
on what the serving layer needs (the rejection channel, ``/metrics`` across processes).
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import pickle
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from integrations.vllm_v1.config.declarative import PipelineConfigError, build_pipeline
from integrations.vllm_v1.config.presets import PRESETS, preset
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.pipeline import Pipeline

CONFIG_KEY = "llm_serving_policies"
"""The key of our entry in vLLM's ``additional_config``."""
PICKLED_PREFIX = "pickle:"
_FILE_SUFFIXES = (".json", ".yaml", ".yml", ".toml")


def config_entry(additional_config: object) -> Mapping[str, Any]:
    """Our entry of vLLM's ``additional_config`` ({} if there is none).

    Raises:
        PipelineConfigError: if the entry is not a mapping.
    """
    entry = additional_config.get(CONFIG_KEY) if isinstance(additional_config, Mapping) else None
    if entry is None:
        return {}
    if not isinstance(entry, Mapping):
        raise PipelineConfigError(f"{CONFIG_KEY} must be a mapping, got {type(entry).__name__}")
    return entry


def pipeline_from_additional_config(additional_config: object) -> Pipeline:
    """The pipeline our entry names; the identity pipeline if it names none."""
    entry = config_entry(additional_config)
    if entry.get("pipeline") is None:
        return Pipeline()
    weights = entry.get("tenant_weights") or {}
    if not isinstance(weights, Mapping):
        raise PipelineConfigError(f"{CONFIG_KEY}.tenant_weights must be a mapping of tenant "
                                  f"-> weight, got {type(weights).__name__}")
    problems = [f"{CONFIG_KEY}.tenant_weights.{tenant} must be a number > 0, got {weight!r}"
                for tenant, weight in weights.items() if isinstance(weight, bool)
                or not isinstance(weight, int | float) or not 0 < weight < math.inf]
    if problems:
        raise PipelineConfigError("\n".join(problems))
    return resolve_pipeline(entry["pipeline"], tenant_weights=weights, slo=entry.get("slo"))


def served_slo(entry: Mapping[str, Any]) -> SLOSpec | None:
    """The SLO declaration (`Pipeline.slo`) of the pipeline our config ``entry`` names: the
    ``slo`` preset's, or the one a pipeline built by `slo_pipeline` carries in any form
    (pickled from Python, an import path); None for a pipeline without one.

    Raises:
        PipelineConfigError: the entry names no pipeline that can be built.
    """
    if entry.get("pipeline") is None:
        return None
    return pipeline_from_additional_config({CONFIG_KEY: entry}).slo


def resolve_pipeline(spec: object, *, tenant_weights: Mapping[str, float] = {},  # noqa: B006
                     slo: object = None) -> Pipeline:
    """The pipeline ``spec`` names (see the module docstring for the forms).

    Raises:
        PipelineConfigError: naming what is wrong (the slot and field, for mappings).
    """
    if isinstance(spec, Pipeline):
        return spec
    if isinstance(spec, Mapping):
        return build_pipeline(spec, where=f"{CONFIG_KEY}.pipeline")
    if not isinstance(spec, str):
        raise PipelineConfigError(f"{CONFIG_KEY}.pipeline must be a preset name, an import "
                                  f"path or a mapping, got {type(spec).__name__}")
    if spec.startswith(PICKLED_PREFIX):
        return _unpickle(spec.removeprefix(PICKLED_PREFIX))
    if spec in PRESETS:
        return preset(spec, tenant_weights, slo=slo)
    if slo is not None:
        raise PipelineConfigError(f"{CONFIG_KEY}.slo is read by the slo preset only")
    if spec.endswith(_FILE_SUFFIXES):
        return build_pipeline(_read_mapping(Path(spec)), where=f"{spec}: pipeline")
    if ":" not in spec:
        raise PipelineConfigError(
            f"unknown pipeline {spec!r}: use one of {sorted(PRESETS)}, 'package.module:attr', "
            "'path/to/file.py:attr' or a .json/.yaml/.toml file")
    return _imported(spec)


def to_additional_config(pipeline: Pipeline, **entry: Any) -> dict[str, Any]:
    """An ``additional_config`` carrying ``pipeline`` itself (pickled) plus ``entry``'s keys."""
    blob = base64.b64encode(pickle.dumps(pipeline)).decode("ascii")
    return {CONFIG_KEY: {**entry, "pipeline": PICKLED_PREFIX + blob}}


def _unpickle(blob: str) -> Pipeline:
    pipeline = pickle.loads(base64.b64decode(blob))
    if not isinstance(pipeline, Pipeline):
        raise PipelineConfigError(f"{CONFIG_KEY}.pipeline holds a {type(pipeline).__name__}")
    return pipeline


def _read_mapping(path: Path) -> Mapping[str, Any]:
    if not path.is_file():
        raise PipelineConfigError(f"pipeline file not found: {path}")
    text = path.read_text()
    if path.suffix == ".toml":
        data = tomllib.loads(text)
    elif path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml  # a vLLM dependency

        data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise PipelineConfigError(f"{path}: a pipeline file holds a mapping of slot -> policy")
    return data.get("pipeline", data) if isinstance(data.get("pipeline"), Mapping) else data


def _imported(spec: str) -> Pipeline:
    location, attr = spec.rsplit(":", 1)
    if location.endswith(".py"):
        path = Path(location).resolve()
        if not path.is_file():
            raise PipelineConfigError(f"pipeline file not found: {location}")
        # Import it as a real module from its folder, so policies defined in the file
        # pickle by reference and the engine process (which inherits sys.path) finds them.
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        location = path.stem
    try:
        module = importlib.import_module(location)
    except ImportError as error:
        raise PipelineConfigError(f"{spec}: cannot import {location!r} ({error})") from error
    value = getattr(module, attr, None)
    if callable(value) and not isinstance(value, Pipeline):
        value = value()
    if not isinstance(value, Pipeline):
        raise PipelineConfigError(f"{spec} is not a Pipeline (got {type(value).__name__})")
    return value
