"""Named pipelines, and resolution of ``NAME``, ``module:attr`` or ``path.py:attr``."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from integrations.vllm_v1.pipeline import Pipeline
from policies import QoSRanker

_QOS = Pipeline(ranking=QoSRanker())

PRESETS: dict[str, Pipeline] = {
    "identity": Pipeline(),
    "qos": _QOS,
    "default": _QOS,
}
"""Built-in pipelines by name: ``identity`` (schedules like stock ``fcfs``), ``qos`` (QoS
ranking) and ``default`` (the recommended composition; today the same as ``qos``)."""


def resolve_pipeline(spec: str) -> Pipeline:
    """The pipeline named by ``spec``: a preset name, ``pkg.module:attr`` or ``file.py:attr``.

    Raises:
        ValueError: if nothing by that name exists or it is not a `Pipeline`.
    """
    if spec in PRESETS:
        return PRESETS[spec]
    if ":" not in spec:
        raise ValueError(f"unknown pipeline {spec!r}: use one of {sorted(PRESETS)}, "
                         "'package.module:attr' or 'path/to/file.py:attr'")
    location, attr = spec.rsplit(":", 1)
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"pipeline file not found: {location}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    pipeline = getattr(module, attr, None)
    if not isinstance(pipeline, Pipeline):
        raise ValueError(f"{spec} is not a Pipeline (got {type(pipeline).__name__})")
    return pipeline
