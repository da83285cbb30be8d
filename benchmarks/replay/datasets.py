"""Real request traces as `Trace` objects: adapters, built-in datasets, tenants.

Built-in traces (files under ``benchmarks/data``, see ``ATTRIBUTION.md`` there):

- ``azure-conv``: Azure LLM inference 2023, conversation service (19,366 requests, ~1 h).
- ``azure-code``: Azure LLM inference 2023, code service (8,819 requests, ~1 h).
- ``mooncake-conv``: Mooncake FAST'25 conversation trace (12,031 requests, ~59 min)
  with 512-token prefix block hashes.
- ``mooncake-synthetic``: Mooncake FAST'25 synthetic trace (3,993 requests, ~17 min,
  Poisson arrivals) built from public datasets, same format.

None of them names tenants; `assign_servegen_tenants` draws tenants with the
rate mix of real Alibaba Bailian clients from ServeGen. Load them, trace files and the
generated workloads through the one entry point,
`benchmarks.replay.workloads.load_workload`.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import random
import re
import tarfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from benchmarks.replay.trace import (
    Trace,
    TraceFormatError,
    TraceRequest,
    load_jsonl,
    numbered_lines,
    parse_json_line,
)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
FORMATS = ("auto", "jsonl", "azure", "mooncake")
BUILTIN_TRACES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "azure-code": ("azure_llm_2023/AzureLLMInferenceTrace_code.csv.gz", "azure"),
        "azure-conv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv.gz", "azure"),
        "mooncake-conv": ("mooncake_fast25/conversation_trace.jsonl.gz", "mooncake"),
        "mooncake-synthetic": ("mooncake_fast25/synthetic_trace.jsonl.gz", "mooncake"),
    }
)
"""Built-in trace name -> (path under `DATA_DIR`, format)."""

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_OPTIONAL_KEYS = ("session_id",)
MOONCAKE_BLOCK_SIZE = 512
SERVEGEN_TARBALL = DATA_DIR / "servegen" / "servegen_deepseek-r1_and_m-small.tar.gz"
_SERVEGEN_CLIENT = re.compile(r"data/language/(m-small)/chunk-(\d+)-trace\.csv")
_DIGITS = re.compile(r"-?[0-9]+")
_FRACTION = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1)


def _positive_int(value: object, key: str) -> int:
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _azure_timestamp_s(text: str) -> float:
    """Seconds since 1970-01-01 of a zone-less ``YYYY-MM-DD HH:MM:SS[.fffffff]`` time."""
    whole, _, fraction = text.partition(".")
    try:
        if fraction and not _FRACTION.fullmatch(fraction):
            raise ValueError(fraction)
        seconds = (datetime.fromisoformat(whole) - _EPOCH).total_seconds()
    except (ValueError, TypeError):  # TypeError: a time zone, which the format has not
        raise ValueError(
            f"TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got {text!r}"
        ) from None
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _rebased_trace(
    path: str | os.PathLike[str],
    name: str,
    rows: list[tuple[int, float, dict[str, Any]]],
    block_size: int | None = None,
) -> Trace:
    """Build a trace from ``(line, time_s, fields)`` rows, shifting the first arrival to 0."""
    start_s = min((time_s for _, time_s, _ in rows), default=0.0)
    requests = []
    for index, (line, time_s, fields) in enumerate(rows):
        try:
            request = TraceRequest(request_id=str(index), arrival_s=time_s - start_s, **fields)
            request.check_block_hashes(block_size)
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
        requests.append(request)
    return Trace(name=name, requests=tuple(requests), block_size=block_size)


def load_azure_csv(path: str | os.PathLike[str], *, name: str | None = None) -> Trace:
    """Read an Azure LLM inference 2023 CSV, arrivals rebased to start at 0 s.

    Columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` become ``arrival_s``,
    ``prompt_tokens`` and ``output_tokens``; request ids are row indices.

    Raises:
        TraceFormatError: on a bad header or row, naming the file and line.
    """
    rows = []
    reader = csv.reader(text for _, text in numbered_lines(path))
    _, header = _csv_row(path, reader)
    if header != list(AZURE_HEADER):
        raise TraceFormatError(
            path, 1, f"expected the header {','.join(AZURE_HEADER)}, got {header!r}"
        )
    while True:
        line, row = _csv_row(path, reader)
        if row is None:
            break
        if not row:
            continue
        if any("\n" in field or "\r" in field for field in row):
            raise TraceFormatError(path, line, "a quoted field runs over several lines "
                                               "(an unterminated quote?)")
        if len(row) != len(AZURE_HEADER):
            raise TraceFormatError(path, line, f"expected 3 fields, got {len(row)}")
        try:
            time_s = _azure_timestamp_s(row[0])
            fields = {
                "prompt_tokens": _positive_int(row[1], "ContextTokens"),
                "output_tokens": _positive_int(row[2], "GeneratedTokens"),
            }
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
        rows.append((line, time_s, fields))
    return _rebased_trace(path, name or _stem(path), rows)


def _csv_row(path: str | os.PathLike[str], reader: Any) -> tuple[int, list[str] | None]:
    """The line the next CSV record starts on, and the record (None at the end); a
    malformed record is a `TraceFormatError` naming the line it starts on."""
    start = reader.line_num + 1
    try:
        return start, next(reader)
    except StopIteration:
        return start, None
    except csv.Error as exc:
        raise TraceFormatError(path, start, f"malformed CSV record ({exc})") from None


def load_mooncake_jsonl(path: str | os.PathLike[str], *, name: str | None = None) -> Trace:
    """Read a Mooncake FAST'25 JSONL trace, arrivals rebased to start at 0 s.

    ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``
    become ``arrival_s``, ``prompt_tokens``, ``output_tokens`` and
    ``block_hashes``, with ``block_size`` 512; request ids are line indices. An optional
    ``session_id`` (a non-empty string, the same for every call of one agent session) is
    kept as the request's session hint.

    Raises:
        TraceFormatError: on a bad line, naming the file and line.
    """
    rows = []
    for line, text in numbered_lines(path):
        if not text.strip():
            continue
        try:
            rows.append((line, *_mooncake_record(text)))
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
    return _rebased_trace(path, name or _stem(path), rows, block_size=MOONCAKE_BLOCK_SIZE)


def _mooncake_record(text: str) -> tuple[float, dict[str, Any]]:
    obj = parse_json_line(text)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in MOONCAKE_KEYS and key not in MOONCAKE_OPTIONAL_KEYS:
            raise ValueError(f"unknown key {key!r}")
    for key in MOONCAKE_KEYS:
        if key not in obj:
            raise ValueError(f"missing required key {key!r}")
    timestamp = obj["timestamp"]
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise ValueError(f"timestamp must be a number of milliseconds, got {timestamp!r}")
    if not math.isfinite(timestamp):
        raise ValueError(f"timestamp must be finite, got {timestamp!r}")
    if not isinstance(obj["hash_ids"], list):
        raise ValueError(f"hash_ids must be a list of integers, got {obj['hash_ids']!r}")
    fields = {
        "prompt_tokens": _positive_int(obj["input_length"], "input_length"),
        "output_tokens": _positive_int(obj["output_length"], "output_length"),
        "block_hashes": obj["hash_ids"],
    }
    if "session_id" in obj:
        session = obj["session_id"]
        if not isinstance(session, str) or not session:
            raise ValueError(f"session_id must be a non-empty string, got {session!r}")
        fields["session_id"] = session
    return timestamp / 1000, fields


def _stem(path: str | os.PathLike[str]) -> str:
    return Path(os.fspath(path).removesuffix(".gz")).stem


def sniff_format(path: str | os.PathLike[str]) -> str:
    """Guess a trace file's format ("jsonl", "azure" or "mooncake") from its first line.

    An Azure header or a ``.csv`` name means "azure"; a JSON object with
    ``arrival_s`` or only header keys means "jsonl"; one with ``timestamp`` and
    ``input_length`` means "mooncake".

    Raises:
        ValueError: if the first non-blank line fits none of them.
    """
    first = next((text for _, text in numbered_lines(path) if text.strip()), "")
    if first.startswith(AZURE_HEADER[0] + ","):
        return "azure"
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        if "arrival_s" in obj or (obj and set(obj) <= {"name", "block_size"}):
            return "jsonl"
        if "timestamp" in obj and "input_length" in obj:
            return "mooncake"
    if os.fspath(path).removesuffix(".gz").endswith(".csv"):
        return "azure"
    raise ValueError(
        f"cannot tell the format of {os.fspath(path)}: its first line is neither an Azure "
        "CSV header nor a canonical or Mooncake JSON object; pass format="
    )


def _read_trace(
    name_or_path: str | os.PathLike[str],
    *,
    format: str = "auto",
    max_requests: int | None = None,
) -> Trace:
    """A built-in trace by name, or a trace file in any supported format (what
    `benchmarks.replay.workloads.load_workload` reads for them).

    Args:
        name_or_path: a key of `BUILTIN_TRACES` or a file path.
        format: "auto" (sniff with `sniff_format`), "jsonl" (canonical),
            "azure" or "mooncake". A built-in name accepts "auto" or its own format.
        max_requests: keep only the first this many requests by arrival.

    Raises:
        ValueError: for an unknown name or missing file (listing the built-in
            names), a bad ``format`` or ``max_requests``, or a bad file
            (`TraceFormatError`).
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if max_requests is not None and (
        isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 0
    ):
        raise ValueError(f"max_requests must be a non-negative integer, got {max_requests!r}")
    if name_or_path in BUILTIN_TRACES:
        relative, own_format = BUILTIN_TRACES[name_or_path]
        if format not in ("auto", own_format):
            raise ValueError(
                f"built-in trace {name_or_path!r} is in {own_format} format, not {format}"
            )
        path, name, format = DATA_DIR / relative, name_or_path, own_format
    elif Path(name_or_path).is_file():
        path, name = Path(name_or_path), None
        format = sniff_format(path) if format == "auto" else format
    else:
        raise ValueError(
            f"unknown trace {os.fspath(name_or_path)!r}: not a file and not a built-in name "
            f"({', '.join(BUILTIN_TRACES)})"
        )
    if format == "jsonl":
        trace = load_jsonl(path)
    elif format == "azure":
        trace = load_azure_csv(path, name=name)
    else:
        trace = load_mooncake_jsonl(path, name=name)
    return trace if max_requests is None else trace.head(max_requests)


@functools.cache
def servegen_client_rates(tarball: Path = SERVEGEN_TARBALL) -> Mapping[str, float]:
    """Mean request rate (req/s) of each ServeGen ``m-small`` language client, highest first.

    A client is one ``data/language/m-small/chunk-N-trace.csv`` (id
    ``m-small/chunk-N``): 2,016 ten-minute windows (14 days) of
    ``window_start_s,rate,cv,dist_name,param1,param2``; its mean rate averages
    ``rate`` over all windows, idle ones included. Ties keep chunk order.

    Raises:
        TraceFormatError: on a malformed row, naming ``tarball:member`` and line.
    """
    rates: list[tuple[float, int, str]] = []
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive:
            match = _SERVEGEN_CLIENT.fullmatch(member.name)
            if match is None or not member.isfile():
                continue
            text = archive.extractfile(member).read().decode("utf-8")
            mean_rate = _mean_rate(f"{os.fspath(tarball)}:{member.name}", text)
            chunk = int(match.group(2))
            rates.append((-mean_rate, chunk, f"{match.group(1)}/chunk-{chunk}"))
    return MappingProxyType({client: -negated for negated, _, client in sorted(rates)})


def _mean_rate(where: str, text: str) -> float:
    """Mean of the ``rate`` column of one ServeGen client's ``chunk-N-trace.csv``."""
    rates = []
    for line, row in enumerate(csv.reader(text.splitlines()), start=1):
        if len(row) != 6:
            raise TraceFormatError(where, line, f"expected 6 fields, got {len(row)}")
        try:
            rate = float(row[1])
        except ValueError:
            rate = math.nan
        if not math.isfinite(rate) or rate < 0:
            raise TraceFormatError(
                where, line, f"rate must be a finite number >= 0, got {row[1]!r}"
            )
        rates.append(rate)
    if not rates:
        raise TraceFormatError(where, 1, "no rows")
    return math.fsum(rates) / len(rates)


def assign_servegen_tenants(trace: Trace, *, num_tenants: int = 7, seed: int = 0) -> Trace:
    """Give every request a tenant drawn with the rate mix of the busiest real clients.

    The ``num_tenants`` ServeGen clients with the highest mean rate
    (`servegen_client_rates`) become tenants ``t0`` (busiest) to
    ``t{num_tenants-1}``; each request (each agent session: all calls with one
    ``session_id`` share the draw of its first call) independently gets tenant ``ti`` with
    probability proportional to client i's mean rate, drawn in arrival order
    from ``random.Random(seed)``. Existing tenants are overwritten; the result
    depends only on the trace, ``num_tenants`` and ``seed``.
    """
    rates = list(servegen_client_rates().values())
    if (
        isinstance(num_tenants, bool)
        or not isinstance(num_tenants, int)
        or not (1 <= num_tenants <= len(rates))
    ):
        raise ValueError(f"num_tenants must be between 1 and {len(rates)}, got {num_tenants!r}")
    names = [f"t{i}" for i in range(num_tenants)]
    rng = random.Random(seed)
    draws = iter(rng.choices(names, weights=rates[:num_tenants], k=len(trace.requests)))
    by_session: dict[str, str] = {}
    tenants = [next(draws) if request.session_id is None
               else by_session.setdefault(request.session_id, next(draws))
               for request in trace.requests]
    return attrs.evolve(
        trace,
        requests=tuple(
            attrs.evolve(request, tenant=tenant)
            for request, tenant in zip(trace.requests, tenants, strict=True)
        ),
    )
