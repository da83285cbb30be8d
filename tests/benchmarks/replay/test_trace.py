"""The canonical trace model and its JSONL format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.replay.trace import (
    Trace,
    TraceFormatError,
    TraceRequest,
    load_jsonl,
    write_jsonl,
)


def request(request_id: str = "r", arrival_s: float = 0.0, **fields: object) -> TraceRequest:
    return TraceRequest(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_tokens=fields.pop("prompt_tokens", 10),
        output_tokens=fields.pop("output_tokens", 5),
        **fields,
    )


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- TraceRequest and Trace -------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt_tokens", 0, "prompt_tokens must be a positive integer, got 0"),
        ("prompt_tokens", 2.0, "prompt_tokens must be a positive integer, got 2.0"),
        ("output_tokens", True, "output_tokens must be a positive integer, got True"),
        ("arrival_s", -1, "arrival_s must be a finite number >= 0, got -1.0"),
        ("arrival_s", math.inf, "arrival_s must be a finite number >= 0, got inf"),
        ("arrival_s", "1", "arrival_s must be a finite number >= 0, got '1'"),
        ("request_id", "", "request_id must be a non-empty string, got ''"),
        ("tenant", 3, "tenant must be a non-empty string, got 3"),
        ("priority", 1.5, "priority must be an integer, got 1.5"),
        ("deadline_s", 0, "deadline_s must be a positive finite number, got 0.0"),
        ("cancel_after_s", math.nan, "cancel_after_s must be a positive finite number, got nan"),
        ("block_hashes", "ab", "block_hashes must be a list of integers, got 'ab'"),
        ("block_hashes", [1, "x"], "block_hashes[1] must be an integer, got 'x'"),
    ],
)
def test_request_rejects_bad_fields_with_exact_messages(field, value, message):
    fields = {"request_id": "r", "arrival_s": 0.0, "prompt_tokens": 1, "output_tokens": 1}
    with pytest.raises(ValueError) as info:
        TraceRequest(**{**fields, field: value})
    assert str(info.value) == message


def test_request_normalises_numbers_and_lists():
    r = request(arrival_s=3, deadline_s=2, block_hashes=[4, 5])
    assert r.arrival_s == 3.0 and isinstance(r.arrival_s, float)
    assert r.deadline_s == 2.0 and isinstance(r.deadline_s, float)
    assert r.block_hashes == (4, 5)


def test_trace_sorts_by_arrival_keeping_ties_in_order():
    trace = Trace(
        name="t",
        requests=[request("c", 2.0), request("a", 1.0), request("b", 1.0)],
    )
    assert [r.request_id for r in trace.requests] == ["a", "b", "c"]


def test_trace_rejects_duplicate_ids():
    with pytest.raises(ValueError, match=r"^duplicate request_id 'x'$"):
        Trace(name="t", requests=[request("x", 0.0), request("x", 1.0)])


def test_trace_requires_block_size_for_hashes():
    with pytest.raises(ValueError) as info:
        Trace(name="t", requests=[request("x", block_hashes=[1])])
    assert str(info.value) == "request 'x' has block_hashes but the trace has no block_size"


def test_trace_accepts_hashes_up_to_the_partial_last_block():
    fitting = request("x", prompt_tokens=9, block_hashes=[1, 2, 3])
    assert Trace(name="t", requests=[fitting], block_size=4).requests == (fitting,)
    with pytest.raises(ValueError) as info:
        Trace(name="t", requests=[attrs.evolve(fitting, block_hashes=(1, 2, 3, 4))], block_size=4)
    assert str(info.value) == (
        "request 'x' has 4 block_hashes, more than the 3 blocks of its 9 prompt tokens "
        "at block_size 4"
    )


def test_duration_is_the_arrival_span():
    assert Trace(name="t", requests=()).duration_s == 0.0
    assert Trace(name="t", requests=[request("a", 5.0)]).duration_s == 0.0
    trace = Trace(name="t", requests=[request("a", 2.0), request("b", 7.5)])
    assert trace.duration_s == 5.5


arrivals = st.lists(
    st.floats(min_value=0, max_value=1e5, allow_nan=False, allow_infinity=False), max_size=30
)


def trace_of(times: list[float]) -> Trace:
    return Trace(
        name="t", requests=[request(str(i), t, deadline_s=1.5) for i, t in enumerate(times)]
    )


@given(times=arrivals, scale=st.floats(min_value=0.01, max_value=100))
def test_scaled_divides_arrivals_and_keeps_everything_else(times, scale):
    trace = trace_of(times)
    faster = trace.scaled(scale)
    assert [r.request_id for r in faster.requests] == [r.request_id for r in trace.requests]
    for before, after in zip(trace.requests, faster.requests, strict=True):
        assert after.arrival_s == before.arrival_s / scale
        assert attrs.evolve(after, arrival_s=before.arrival_s) == before
    assert faster.duration_s == pytest.approx(trace.duration_s / scale, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("scale", [0, -1.0, math.inf, math.nan, "2"])
def test_scaled_rejects_bad_scales(scale):
    with pytest.raises(ValueError, match="rate_scale must be a positive finite number"):
        trace_of([0.0]).scaled(scale)


@given(times=arrivals, n=st.integers(min_value=0, max_value=40))
def test_head_keeps_the_earliest_requests(times, n):
    trace = trace_of(times)
    head = trace.head(n)
    assert head.requests == trace.requests[:n]
    assert len(head.requests) == min(n, len(times))


def test_head_rejects_negative_n():
    with pytest.raises(ValueError, match=r"^n must be a non-negative integer, got -1$"):
        trace_of([0.0]).head(-1)


# --- JSONL round trip ---------------------------------------------------------

names = st.none() | st.text(alphabet="abcxyz-_é", min_size=1, max_size=6)
seconds = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    block_size = draw(st.none() | st.integers(min_value=1, max_value=64))
    requests = []
    for i in range(draw(st.integers(min_value=0, max_value=8))):
        prompt = draw(st.integers(min_value=1, max_value=300))
        hashes = ()
        if block_size is not None:
            limit = -(-prompt // block_size)
            hashes = draw(st.lists(st.integers(-(2**63), 2**64), max_size=min(limit, 5)))
        requests.append(
            TraceRequest(
                request_id=draw(
                    st.just(str(i)) | st.text(min_size=1, max_size=5).map(f"{i}:".__add__)
                ),
                arrival_s=draw(st.floats(min_value=0, max_value=1e6, allow_nan=False)),
                prompt_tokens=prompt,
                output_tokens=draw(st.integers(min_value=1, max_value=10**6)),
                tenant=draw(names),
                priority=draw(st.integers(min_value=-(10**6), max_value=10**6)),
                slo_class=draw(names),
                deadline_s=draw(st.none() | seconds),
                session_id=draw(names),
                block_hashes=hashes,
                cancel_after_s=draw(st.none() | seconds),
            )
        )
    name = draw(st.text(min_size=1, max_size=10))
    return Trace(name=name, requests=requests, block_size=block_size)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(trace=traces(), suffix=st.sampled_from([".jsonl", ".jsonl.gz"]))
def test_write_then_load_gives_an_equal_trace(tmp_path, trace, suffix):
    path = tmp_path / f"trace{suffix}"
    write_jsonl(trace, path)
    assert load_jsonl(path) == trace


def test_written_file_is_the_documented_format(tmp_path):
    trace = Trace(
        name="demo",
        requests=[request("a", 0.5, tenant="t1", block_hashes=[7]), request("b", 1.0)],
        block_size=16,
    )
    path = tmp_path / "demo.jsonl"
    write_jsonl(trace, path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"name": "demo", "block_size": 16},
        {"request_id": "a", "arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 5,
         "tenant": "t1", "block_hashes": [7]},
        {"request_id": "b", "arrival_s": 1.0, "prompt_tokens": 10, "output_tokens": 5},
    ]  # fmt: skip


def test_loader_defaults_name_ids_and_skips_blank_lines(tmp_path):
    path = write_lines(
        tmp_path / "my_trace.jsonl",
        [
            '{"arrival_s": 1, "prompt_tokens": 3, "output_tokens": 4}',
            "",
            '{"arrival_s": 0.5, "prompt_tokens": 8, "output_tokens": 2, "priority": -1}',
        ],
    )
    trace = load_jsonl(path)
    assert trace.name == "my_trace"
    assert trace.block_size is None
    assert [(r.request_id, r.arrival_s, r.priority) for r in trace.requests] == [
        ("1", 0.5, -1),
        ("0", 1.0, 0),
    ]


# --- JSONL errors: file, 1-based line and reason ------------------------------

GOOD = '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 4}'


@pytest.mark.parametrize(
    ("lines", "line", "reason"),
    [
        (
            [GOOD] * 6 + ['{"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 4}'],
            7,
            "prompt_tokens must be a positive integer, got -3",
        ),
        ([GOOD, '{"arrival_s": 1, "prompt_tokens": 3}'], 2, "missing required key 'output_tokens'"),
        ([GOOD, GOOD[:-1] + ', "colour": "red"}'], 2, "unknown key 'colour'"),
        ([GOOD, "{not json"], 2, "invalid JSON: Expecting property name enclosed in double quotes"),
        (["", "[1, 2]"], 2, "expected a JSON object, got list"),
        (['{"name": "x", "block_sise": 4}', GOOD], 1, "unknown header key 'block_sise' (expected name, block_size)"),
        (['{"block_size": 0}'], 1, "block_size must be a positive integer, got 0"),
        (['{"name": ""}'], 1, "name must be a non-empty string, got ''"),
        (
            [GOOD, '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 4, "block_hashes": [1]}'],
            2,
            "request '1' has block_hashes but the trace has no block_size",
        ),
        (
            ['{"block_size": 2}', GOOD[:-1] + ', "block_hashes": [1, 2, 3]}'],
            2,
            "request '0' has 3 block_hashes, more than the 2 blocks of its 3 prompt tokens "
            "at block_size 2",
        ),
        (
            [GOOD[:-1] + ', "request_id": "a"}', GOOD, GOOD[:-1] + ', "request_id": "a"}'],
            3,
            "duplicate request_id 'a' (first on line 1)",
        ),
        ([GOOD, '{"name": "late header"}'], 2, "unknown key 'name'"),
        ([GOOD[:-1] + ', "deadline_s": -2}'], 1, "deadline_s must be a positive finite number, got -2.0"),
    ],
)  # fmt: skip
def test_loader_errors_name_file_line_and_reason(tmp_path, lines, line, reason):
    path = write_lines(tmp_path / "trace.jsonl", lines)
    with pytest.raises(TraceFormatError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path}:{line}: {reason}"
    assert (info.value.path, info.value.line, info.value.reason) == (str(path), line, reason)
    assert isinstance(info.value, ValueError)
