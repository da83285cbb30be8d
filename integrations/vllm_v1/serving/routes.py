"""Which HTTP routes reach the engine's scheduler, read from the app's own routes.

No list of paths: a ``POST`` route reaches the scheduler when its request body can
carry scheduling metadata, which vLLM declares as fields of the route's body model:
``priority``, ``vllm_xargs`` and/or ``sampling_params`` (whose ``extra_args`` are
what ``vllm_xargs`` become). In vLLM 0.32 that is ``/v1/completions``,
``/v1/chat/completions``, ``/v1/chat/completions/batch``, ``/v1/responses``,
``/v1/messages``, ``/v1/systemone``, ``/generative_scoring``,
``/inference/v1/generate`` and, on pooling models, the pooling routes; a route vLLM
adds later with those fields is found the same way. A route with ``priority`` but
no such mapping (``/v1/chat/completions/batch``, ``/generative_scoring``) cannot
carry a tenant to the scheduler (`EngineRoute.reads_xargs` is False).
A ``POST`` route with no declared body model (SageMaker's ``/invocations``, which
validates a chat or completion body itself) reaches the scheduler when its JSON body
is a generation request: an object with ``prompt``, ``messages`` or ``input``.

Errors are answered in the route's own error format, read from the model it declares
for HTTP 400: OpenAI's ``{"error": {...}}`` or, for a model with a top-level ``type``
field (Anthropic's ``/v1/messages``), ``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

XARGS = ("vllm_xargs",)
SAMPLING_EXTRA_ARGS = ("sampling_params", "extra_args")
GENERATION_KEYS = ("prompt", "messages", "input")
"""Keys that make the JSON body of an untyped ``POST`` route a generation request."""


@attrs.frozen(kw_only=True)
class EngineRoute:
    """A route whose requests reach the scheduler, and which metadata fields it reads."""

    path: str
    reads_priority: bool
    """The body's ``priority`` field reaches the scheduler (else vLLM ignores it)."""
    reads_xargs: bool
    """The body's ``vllm_xargs`` (at `xargs_path`) reach the scheduler (tenant, class,
    deadline); False: the route cannot carry a tenant."""
    xargs_path: tuple[str, ...] = XARGS
    """Where the body holds them: ``vllm_xargs``, or ``sampling_params.extra_args``."""
    anthropic_errors: bool = False
    """Errors in Anthropic's format (``{"type": "error", "error": {...}}``)."""
    typed: bool = True
    """False for a route without a declared body model (judged by its body)."""

    def accepts(self, payload: object) -> bool:
        """Whether a request with this JSON ``payload`` reaches the scheduler."""
        if self.typed:
            return True
        return isinstance(payload, dict) and any(key in payload for key in GENERATION_KEYS)


@attrs.define(eq=False)
class RouteTable:
    """The engine routes of one app, matched by method and path."""

    routes: tuple[tuple[re.Pattern[str], EngineRoute], ...]

    @classmethod
    def from_app(cls, app: Any) -> RouteTable:
        """The engine routes of a Starlette/FastAPI ``app`` (an empty table for anything else)."""
        return cls(tuple(_engine_routes(getattr(app, "routes", ()) or ())))

    def match(self, scope: Mapping[str, Any]) -> EngineRoute | None:
        """The engine route an HTTP ``scope`` addresses, or None."""
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return None
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        for pattern, route in self.routes:
            if pattern.match(path):
                return route
        return None

    @property
    def paths(self) -> tuple[str, ...]:
        """The matched route templates, in the app's order."""
        return tuple(route.path for _, route in self.routes)


def _engine_routes(routes: Iterable[Any]) -> Iterable[tuple[re.Pattern[str], EngineRoute]]:
    for route in routes:
        methods = getattr(route, "methods", None) or ()
        pattern = getattr(route, "path_regex", None)
        if "POST" not in methods or pattern is None:
            continue
        dependant = getattr(route, "dependant", None)
        if dependant is None:
            continue  # a plain Starlette route: no declared request semantics
        fields = _body_fields(dependant)
        anthropic = _anthropic_errors(route)
        if fields is None:
            yield pattern, EngineRoute(path=route.path, reads_priority=True, reads_xargs=True,
                                       anthropic_errors=anthropic, typed=False)
        elif fields & {"priority", "vllm_xargs", SAMPLING_EXTRA_ARGS[0]}:
            path = (SAMPLING_EXTRA_ARGS if SAMPLING_EXTRA_ARGS[0] in fields
                    and "vllm_xargs" not in fields else XARGS)
            yield pattern, EngineRoute(path=route.path, reads_priority="priority" in fields,
                                       reads_xargs=path[0] in fields, xargs_path=path,
                                       anthropic_errors=anthropic)


def _body_fields(dependant: Any) -> set[str] | None:
    """The field names of the route's body model(s); None when it declares no body."""
    params = list(getattr(dependant, "body_params", None) or ())
    if not params:
        return None
    fields: set[str] = set()
    for param in params:
        annotation = getattr(getattr(param, "field_info", None), "annotation", None)
        for model in _models(annotation):
            fields.update(getattr(model, "model_fields", {}))
    return fields


def _models(annotation: object) -> list[type]:
    """The pydantic model classes in an annotation (a model or a union of models)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType or origin is typing.Annotated:
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return [annotation] if isinstance(annotation, type) and hasattr(annotation,
                                                                   "model_fields") else []


def _anthropic_errors(route: Any) -> bool:
    declared = (getattr(route, "responses", None) or {}).get(400) or {}
    model = declared.get("model") if isinstance(declared, Mapping) else None
    return "type" in (getattr(model, "model_fields", None) or {})
