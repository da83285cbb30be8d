"""Canonical request traces: a validated frozen model and its JSONL file format.

A trace file is UTF-8 JSON Lines, gzip-compressed when its name ends in ``.gz``.
Each line is one JSON object; blank lines are skipped. The first line may be a
header, recognised by having no ``arrival_s`` key:

    {"name": "mooncake-conv", "block_size": 512}
    {"arrival_s": 0.0, "prompt_tokens": 6758, "output_tokens": 500, "block_hashes": [0, 1]}
    {"arrival_s": 0.25, "prompt_tokens": 812, "output_tokens": 97, "tenant": "t3"}

Header keys, both optional:

- ``name``: the trace's name (default: the file name without its extensions).
- ``block_size``: tokens per entry of ``block_hashes``; required when any request
  has ``block_hashes``.

Request keys (``arrival_s``, ``prompt_tokens`` and ``output_tokens`` are required):

- ``arrival_s``: seconds from the start of the trace, finite and >= 0.
- ``prompt_tokens``, ``output_tokens``: integers >= 1.
- ``request_id``: a non-empty string, unique in the file (default: the 0-based
  index of the request among the file's request lines, as a string).
- ``tenant``, ``slo_class``, ``session_id``: non-empty strings.
- ``priority``: an integer, default 0; lower is more urgent (as in vLLM).
- ``deadline_s``: seconds from arrival by which the request should finish (> 0).
- ``cancel_after_s``: seconds from arrival after which the client cancels (> 0).
- ``block_hashes``: a list of integers, one per ``block_size`` prompt tokens from
  the start of the prompt; equal hashes at equal positions mean a shared prefix.

Any other key (or a key given twice), a wrong type or a bad value raises
`TraceFormatError` naming the file, the 1-based line and the reason; so does a line
that cannot be read (not UTF-8, a truncated or corrupt gzip stream), at the first
such line, before anything after it is read.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

REQUIRED_KEYS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_KEYS = (
    "request_id",
    "tenant",
    "priority",
    "slo_class",
    "deadline_s",
    "session_id",
    "block_hashes",
    "cancel_after_s",
)
HEADER_KEYS = ("name", "block_size")


class TraceFormatError(ValueError):
    """A trace file breaks its format; the message reads ``path:line: reason``."""

    def __init__(self, path: str | os.PathLike[str], line: int, reason: str) -> None:
        super().__init__(f"{os.fspath(path)}:{line}: {reason}")
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_float(value: object) -> object:
    """Turn an int into a float; leave anything else for the validator to judge."""
    return float(value) if _is_int(value) else value


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _check_positive_int(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


def _check_int(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_int(value):
        raise ValueError(f"{attribute.name} must be an integer, got {value!r}")


def _check_arrival(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _check_optional_duration(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


def _check_name(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _check_optional_name(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None:
        _check_name(instance, attribute, value)


def _check_optional_positive_int(
    instance: object, attribute: attrs.Attribute, value: object
) -> None:
    if value is not None:
        _check_positive_int(instance, attribute, value)


def _check_hashes(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, tuple):
        raise ValueError(f"{attribute.name} must be a list of integers, got {value!r}")
    for index, block_hash in enumerate(value):
        if not _is_int(block_hash):
            raise ValueError(f"{attribute.name}[{index}] must be an integer, got {block_hash!r}")


@attrs.frozen(kw_only=True)
class TraceRequest:
    """One request of a trace; every field is validated on construction.

    ``deadline_s`` and ``cancel_after_s`` are durations from ``arrival_s``, so
    they survive `Trace.scaled` unchanged.
    """

    request_id: str = attrs.field(validator=_check_name)
    arrival_s: float = attrs.field(converter=_as_float, validator=_check_arrival)
    prompt_tokens: int = attrs.field(validator=_check_positive_int)
    output_tokens: int = attrs.field(validator=_check_positive_int)
    tenant: str | None = attrs.field(default=None, validator=_check_optional_name)
    priority: int = attrs.field(default=0, validator=_check_int)
    slo_class: str | None = attrs.field(default=None, validator=_check_optional_name)
    deadline_s: float | None = attrs.field(
        default=None, converter=_as_float, validator=_check_optional_duration
    )
    session_id: str | None = attrs.field(default=None, validator=_check_optional_name)
    block_hashes: tuple[int, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=_check_hashes
    )
    cancel_after_s: float | None = attrs.field(
        default=None, converter=_as_float, validator=_check_optional_duration
    )

    def check_block_hashes(self, block_size: int | None) -> None:
        """Raise ValueError unless ``block_hashes`` fit the prompt at ``block_size``.

        At most ``ceil(prompt_tokens / block_size)`` hashes fit; any hash needs a
        block size.
        """
        if not self.block_hashes:
            return
        if block_size is None:
            raise ValueError(
                f"request {self.request_id!r} has block_hashes but the trace has no block_size"
            )
        limit = -(-self.prompt_tokens // block_size)
        if len(self.block_hashes) > limit:
            raise ValueError(
                f"request {self.request_id!r} has {len(self.block_hashes)} block_hashes, "
                f"more than the {limit} blocks of its {self.prompt_tokens} prompt tokens "
                f"at block_size {block_size}"
            )


def _sorted_by_arrival(requests: Iterable[TraceRequest]) -> tuple[TraceRequest, ...]:
    return tuple(sorted(requests, key=lambda request: request.arrival_s))


@attrs.frozen(kw_only=True)
class Trace:
    """A named sequence of requests, always sorted by arrival (stable for ties).

    Request ids are unique, and every request's ``block_hashes`` fit its prompt
    at the trace's ``block_size`` (tokens per hash).
    """

    name: str = attrs.field(validator=_check_name)
    requests: tuple[TraceRequest, ...] = attrs.field(converter=_sorted_by_arrival)
    block_size: int | None = attrs.field(default=None, validator=_check_optional_positive_int)

    def __attrs_post_init__(self) -> None:
        seen: set[str] = set()
        for request in self.requests:
            if not isinstance(request, TraceRequest):
                raise ValueError(f"requests must be TraceRequest objects, got {request!r}")
            if request.request_id in seen:
                raise ValueError(f"duplicate request_id {request.request_id!r}")
            seen.add(request.request_id)
            request.check_block_hashes(self.block_size)

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last (0.0 for under two requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def scaled(self, rate_scale: float) -> Trace:
        """The same trace offered ``rate_scale`` times as fast: arrivals divided by it.

        Token counts, deadlines and cancellation delays are unchanged.
        """
        if not _is_number(rate_scale) or not math.isfinite(rate_scale) or rate_scale <= 0:
            raise ValueError(f"rate_scale must be a positive finite number, got {rate_scale!r}")
        return attrs.evolve(
            self,
            requests=tuple(
                attrs.evolve(request, arrival_s=request.arrival_s / rate_scale)
                for request in self.requests
            ),
        )

    def head(self, n: int) -> Trace:
        """The first ``n`` requests by arrival (all of them if there are fewer)."""
        if not _is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        return attrs.evolve(self, requests=self.requests[:n])


def open_text(path: str | os.PathLike[str], mode: str = "r") -> IO[str]:
    """Open a UTF-8 text file for ``mode`` "r" or "w", through gzip if it ends in ``.gz``."""
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")  # noqa: SIM115 - returned to the caller


def numbered_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` of a trace file, through gzip if it ends in ``.gz``.

    Lines are read as bytes and decoded one by one, so an error names its own line.

    Raises:
        TraceFormatError: naming the line that cannot be read (not UTF-8, a truncated
            or corrupt gzip stream); OSError if the file cannot be opened.
    """
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "rb") as raw:
        line = 0
        while True:
            line += 1
            try:
                data = raw.readline()
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                raise TraceFormatError(path, line, f"cannot read the gzip stream ({exc})"
                                       ) from None
            if not data:
                return
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(path, line, f"not UTF-8 text (byte {exc.start + 1} of "
                                                   f"the line: {exc.reason})") from None
            yield line, text


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} given twice")
        obj[key] = value
    return obj


def parse_json_line(text: str) -> Any:
    """One line of JSON, refusing a key given twice (``json`` would keep the last silently).

    Raises:
        ValueError: the reason, for the caller to put in a `TraceFormatError`.
    """
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None


def _default_name(path: str | os.PathLike[str]) -> str:
    return Path(os.fspath(path).removesuffix(".gz")).stem


def _parse_header(path: str | os.PathLike[str], line: int, obj: dict[str, Any]) -> dict[str, Any]:
    for key in obj:
        if key not in HEADER_KEYS:
            raise TraceFormatError(
                path, line, f"unknown header key {key!r} (expected {', '.join(HEADER_KEYS)})"
            )
    name = obj.get("name", _default_name(path))
    if not isinstance(name, str) or not name:
        raise TraceFormatError(path, line, f"name must be a non-empty string, got {name!r}")
    block_size = obj.get("block_size")
    if block_size is not None and (not _is_int(block_size) or block_size < 1):
        raise TraceFormatError(
            path, line, f"block_size must be a positive integer, got {block_size!r}"
        )
    return {"name": name, "block_size": block_size}


def _parse_request(
    path: str | os.PathLike[str], line: int, obj: dict[str, Any], index: int
) -> TraceRequest:
    for key in obj:
        if key not in REQUIRED_KEYS and key not in OPTIONAL_KEYS:
            raise TraceFormatError(path, line, f"unknown key {key!r}")
    for key in REQUIRED_KEYS:
        if key not in obj:
            raise TraceFormatError(path, line, f"missing required key {key!r}")
    try:
        return TraceRequest(**{"request_id": str(index), **obj})
    except ValueError as exc:
        raise TraceFormatError(path, line, str(exc)) from None


def load_jsonl(path: str | os.PathLike[str]) -> Trace:
    """Read a canonical JSONL trace, validating every line (see the module docs).

    Raises:
        TraceFormatError: on the first bad line, naming the file, line and reason.
    """
    header = {"name": _default_name(path), "block_size": None}
    requests: list[TraceRequest] = []
    first_line_of: dict[str, int] = {}
    seen_content = False
    for line, text in numbered_lines(path):
        if not text.strip():
            continue
        try:
            obj = parse_json_line(text)
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
        if not isinstance(obj, dict):
            raise TraceFormatError(
                path, line, f"expected a JSON object, got {type(obj).__name__}"
            )
        if not seen_content and "arrival_s" not in obj:
            header = _parse_header(path, line, obj)
            seen_content = True
            continue
        seen_content = True
        request = _parse_request(path, line, obj, len(requests))
        if request.request_id in first_line_of:
            raise TraceFormatError(
                path,
                line,
                f"duplicate request_id {request.request_id!r} "
                f"(first on line {first_line_of[request.request_id]})",
            )
        first_line_of[request.request_id] = line
        try:
            request.check_block_hashes(header["block_size"])
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
        requests.append(request)
    return Trace(name=header["name"], requests=tuple(requests), block_size=header["block_size"])


def _request_record(request: TraceRequest) -> dict[str, Any]:
    record: dict[str, Any] = {
        "request_id": request.request_id,
        "arrival_s": request.arrival_s,
        "prompt_tokens": request.prompt_tokens,
        "output_tokens": request.output_tokens,
    }
    for field in attrs.fields(TraceRequest):
        value = getattr(request, field.name)
        if field.name not in record and value != field.default:
            record[field.name] = list(value) if field.name == "block_hashes" else value
    return record


def write_jsonl(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` so that `load_jsonl` reads back an equal `Trace`.

    The header carries the name and block size; optional request fields are
    written only when they differ from their defaults.
    """
    header: dict[str, Any] = {"name": trace.name}
    if trace.block_size is not None:
        header["block_size"] = trace.block_size
    with open_text(path, "w") as out:
        out.write(json.dumps(header) + "\n")
        for request in trace.requests:
            out.write(json.dumps(_request_record(request)) + "\n")
