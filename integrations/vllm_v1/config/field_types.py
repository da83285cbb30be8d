"""What a configuration value must be, read from the annotation of the field it sets.

`type_problem` checks a value from JSON, YAML or TOML against an attrs field's annotation
(``int``, ``float | None``, ``Mapping[str, float]``, ``tuple[tuple[str, int], ...]``,
``SessionPins | None``, ...) before the class's constructor sees it, so a wrong type is
named by its field instead of surfacing as whatever the constructor trips over. Lists stand
for tuples and sets; a mapping stands for a tuple of pairs (its items); a policy class stands
for a mapping with ``class`` that builds one. Mapping keys are not checked (JSON keys are
strings). A part the checker does not know (a protocol, ``Hashable``, ``random.Random``)
accepts anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

import policies

_PLAIN: dict[str, tuple[str, str, Callable[[Any], bool]]] = {
    "int": ("an integer", "integers",
            lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", "numbers",
              lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "bool": ("true or false", "true or false values", lambda v: isinstance(v, bool)),
    "str": ("a string", "strings", lambda v: isinstance(v, str)),
}
_MAPPINGS = frozenset({"Mapping", "MutableMapping", "dict"})
_SEQUENCES = frozenset({"tuple", "list", "Sequence", "frozenset", "set", "AbstractSet"})
_TOKEN = re.compile(r"\.\.\.|[\w.]+|[\[\],|]")
_PUNCTUATION = frozenset({"[", "]", ",", "|", "..."})
Union = tuple
"""A parsed annotation: ``(name, args)`` alternatives, a value fits one; ``args`` holds a
`Union` per argument, or ``...``."""


def type_problem(annotation: object, value: Any) -> str | None:
    """What ``value`` must be (``"an integer"``, ``"a mapping of strings to numbers"``), if
    ``annotation`` says it is not that; None if it fits or the annotation is not known."""
    union = _parse(str(getattr(annotation, "__name__", annotation)))
    if union is None or _fits(union, value):
        return None
    return _describe(union)


def _parse(text: str) -> Union | None:
    tokens = _TOKEN.findall(text.replace("typing.", "").replace("collections.abc.", ""))
    try:
        union, end = _union(tokens, 0)
    except (IndexError, ValueError):
        return None
    return union if end == len(tokens) else None


def _union(tokens: list[str], i: int) -> tuple[Union, int]:
    alternatives = []
    while True:
        name, i = tokens[i], i + 1
        if name in _PUNCTUATION:
            raise ValueError(name)
        args: list = []
        if i < len(tokens) and tokens[i] == "[":
            i += 1
            while tokens[i] != "]":
                if tokens[i] in (",", "..."):
                    args.extend([...] if tokens[i] == "..." else [])
                    i += 1
                    continue
                arg, i = _union(tokens, i)
                args.append(arg)
            i += 1
        alternatives.append((name.rsplit(".", 1)[-1], tuple(args)))
        if i < len(tokens) and tokens[i] == "|":
            i += 1
            continue
        return tuple(alternatives), i


def _policy_class(name: str) -> type | None:
    cls = getattr(policies, name, None) if name in policies.__all__ else None
    return cls if isinstance(cls, type) and attrs.has(cls) else None


def _fits(union: Union, value: Any) -> bool:
    return any(_fits_one(name, args, value) is not False for name, args in union)


def _fits_one(name: str, args: tuple, value: Any) -> bool | None:
    """Whether ``value`` fits ``name[args]``; None where the checker does not know it."""
    if name == "None":
        return value is None
    if name in _PLAIN:
        return _PLAIN[name][2](value)
    if name in _MAPPINGS:
        return isinstance(value, Mapping) and (
            len(args) < 2 or all(_fits(args[1], item) for item in value.values()))
    if name in _SEQUENCES:
        if isinstance(value, Mapping) and name == "tuple" and args[1:] == (...,):
            value = list(value.items())  # a mapping for a tuple of pairs
        if not isinstance(value, list | tuple | set | frozenset):
            return False
        if not args:
            return True
        if name == "tuple" and args[-1] is not ...:
            return len(value) == len(args) and all(map(_fits, args, value))
        return all(_fits(args[0], item) for item in value)
    cls = _policy_class(name)
    return None if cls is None else isinstance(value, cls)


def _describe(union: Union, plural: bool = False) -> str:
    return " or ".join(_describe_one(name, args, plural) for name, args in union)


def _describe_one(name: str, args: tuple, plural: bool) -> str:
    if name == "None":
        return "null"
    if name in _PLAIN:
        return _PLAIN[name][1 if plural else 0]
    if name in _MAPPINGS:
        return ("mappings" if plural else "a mapping") + (
            f" of {_describe(args[0], True)} to {_describe(args[1], True)}"
            if len(args) == 2 else "")
    if name in _SEQUENCES:
        if name == "tuple" and args and args[-1] is not ...:
            kind = "pair" if len(args) == 2 else "list"
            items = ", ".join(_describe(arg) for arg in args)
            return f"{kind}s [{items}]" if plural else f"a {kind} [{items}]"
        return ("lists" if plural else "a list") + (
            f" of {_describe(args[0], True)}" if args else "")
    if _policy_class(name) is not None:
        return f"{name} mappings" if plural else f"a {name} (a mapping with 'class')"
    return name
