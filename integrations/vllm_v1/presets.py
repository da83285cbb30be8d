"""Named pipelines, and resolution of ``NAME``, ``module:attr`` or ``path.py:attr``."""

from __future__ import annotations

import importlib
import sys
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
        path = Path(location).resolve()
        if not path.is_file():
            raise ValueError(f"pipeline file not found: {location}")
        # Import it as a real module from its folder, so policies defined in the file
        # pickle by reference and the engine process (which inherits sys.path) finds them.
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        location = path.stem
    module = importlib.import_module(location)
    pipeline = getattr(module, attr, None)
    if not isinstance(pipeline, Pipeline):
        raise ValueError(f"{spec} is not a Pipeline (got {type(pipeline).__name__})")
    return pipeline
