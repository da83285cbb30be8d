"""Real-trace adapters, the built-in datasets and ServeGen tenant synthesis."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from pathlib import Path

import attrs
import pytest

from benchmarks.replay.datasets import (
    BUILTIN_TRACES,
    DATA_DIR,
    assign_servegen_tenants,
    servegen_client_rates,
    sniff_format,
)
from benchmarks.replay.trace import Trace, TraceFormatError, write_jsonl
from benchmarks.replay.workloads import load_workload


@pytest.fixture(scope="module")
def builtin() -> dict[str, Trace]:
    return {name: load_workload(name) for name in BUILTIN_TRACES}


@pytest.mark.parametrize(
    ("name", "count", "block_size"),
    [("azure-conv", 19_366, None), ("azure-code", 8_819, None), ("mooncake-conv", 12_031, 512)],
)
def test_builtin_traces_load_whole_and_in_arrival_order(builtin, name, count, block_size):
    trace = builtin[name]
    assert trace.name == name
    assert len(trace.requests) == count
    assert trace.block_size == block_size
    times = [r.arrival_s for r in trace.requests]
    assert times[0] == 0.0
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))
    assert 3_400 < trace.duration_s < 3_600
    assert [r.request_id for r in trace.requests] == [str(i) for i in range(count)]


def test_azure_timestamps_keep_sub_millisecond_precision(builtin):
    first, second = builtin["azure-code"].requests[:2]
    assert (first.prompt_tokens, first.output_tokens) == (4808, 10)
    assert (second.prompt_tokens, second.output_tokens) == (3180, 8)
    assert second.arrival_s == pytest.approx(0.052, abs=1e-6)  # 04.0319600 - 03.9799600
    last = builtin["azure-conv"].requests[-1]  # 19:14:08.4025270 - 18:15:46.6805900
    assert last.arrival_s == pytest.approx(58 * 60 + 21.721937, abs=1e-6)
    assert (last.prompt_tokens, last.output_tokens) == (197, 183)


def test_mooncake_hashes_cover_every_prompt_block(builtin):
    trace = builtin["mooncake-conv"]
    assert all(len(r.block_hashes) == math.ceil(r.prompt_tokens / 512) for r in trace.requests)
    first = trace.requests[0]
    assert (first.prompt_tokens, first.output_tokens) == (6758, 500)
    assert first.block_hashes == tuple(range(14))
    assert trace.requests[-1].arrival_s == 3536.999
    assert len({h for r in trace.requests for h in r.block_hashes}) == 182_790


def test_max_requests_keeps_the_earliest(builtin):
    assert load_workload("azure-code", max_requests=100) == builtin["azure-code"].head(100)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"name_or_path": "azure-chat"},
            "unknown trace 'azure-chat': not a file and not a built-in name "
            "(azure-code, azure-conv, mooncake-conv, mooncake-synthetic)",
        ),
        ({"name_or_path": "azure-conv", "format": "csv"}, "format must be one of auto, jsonl, "
         "azure, mooncake, got 'csv'"),
        ({"name_or_path": "azure-conv", "format": "mooncake"}, "built-in trace 'azure-conv' is "
         "in azure format, not mooncake"),
        ({"name_or_path": "azure-conv", "max_requests": -1}, "max_requests must be a "
         "non-negative integer, got -1"),
    ],
)  # fmt: skip
def test_load_workload_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as info:
        load_workload(**kwargs)
    assert str(info.value) == message


AZURE_CSV = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 23:59:59.5000000,100,7\n"
    "2023-11-17 00:00:01,20,3\n"
)
MOONCAKE = (
    '{"timestamp": 1500, "input_length": 600, "output_length": 9, "hash_ids": [3, 4]}\n'
    '{"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [3]}\n'
)


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("file_name", ["small.csv", "small.csv.gz", "small.txt"])
def test_azure_files_are_sniffed_and_rebased(tmp_path, file_name):
    path = write(tmp_path / file_name, AZURE_CSV)
    assert sniff_format(path) == "azure"
    trace = load_workload(str(path))
    assert trace.name == "small"
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 100, 7),
        (1.5, 20, 3),
    ]


@pytest.mark.parametrize("file_name", ["mc.jsonl", "mc.jsonl.gz"])
def test_mooncake_files_are_sniffed_and_rebased(tmp_path, file_name):
    path = write(tmp_path / file_name, MOONCAKE)
    assert sniff_format(path) == "mooncake"
    trace = load_workload(str(path))
    assert trace.block_size == 512
    assert [(r.request_id, r.arrival_s, r.block_hashes) for r in trace.requests] == [
        ("1", 0.0, (3,)),
        ("0", 0.5, (3, 4)),
    ]


def test_canonical_files_are_sniffed_with_or_without_header(tmp_path, builtin):
    trace = builtin["mooncake-conv"].head(50)
    path = tmp_path / "canon.jsonl.gz"
    write_jsonl(trace, path)
    assert sniff_format(path) == "jsonl"
    assert load_workload(str(path)) == trace
    bare = write(
        tmp_path / "bare.jsonl", '{"arrival_s": 2, "prompt_tokens": 1, "output_tokens": 1}\n'
    )
    assert sniff_format(bare) == "jsonl"


def test_unrecognisable_files_are_refused(tmp_path):
    path = write(tmp_path / "notes.txt", "hello\n")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*notes\.txt"):
        load_workload(str(path))


@pytest.mark.parametrize(
    ("file_name", "text", "line", "reason"),
    [
        ("a.csv", "TIMESTAMP,Context,Generated\n", 1,
         "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, "
         "got ['TIMESTAMP', 'Context', 'Generated']"),
        ("a.csv", AZURE_CSV + "2023-11-17 00:00:02,0,3\n", 4,
         "ContextTokens must be a positive integer, got 0"),
        ("a.csv", AZURE_CSV + "2023-11-17 00:00:02,5,x\n", 4,
         "GeneratedTokens must be a positive integer, got 'x'"),
        ("a.csv", AZURE_CSV + "yesterday,5,3\n", 4,
         "TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got 'yesterday'"),
        ("a.csv", AZURE_CSV + "2023-11-17 00:00:02,5\n", 4, "expected 3 fields, got 2"),
        ("m.jsonl", MOONCAKE + '{"timestamp": 1, "input_length": 5, "output_length": 1}\n', 3,
         "missing required key 'hash_ids'"),
        ("m.jsonl", '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [], '
         '"x": 1}\n', 1, "unknown key 'x'"),
        ("m.jsonl", MOONCAKE + '{"timestamp": 9, "input_length": 5, "output_length": 1, '
         '"hash_ids": [1, 2]}\n', 3,
         "request '2' has 2 block_hashes, more than the 1 blocks of its 5 prompt tokens "
         "at block_size 512"),
        ("m.jsonl", MOONCAKE + '{"timestamp": 9, "input_length": 5.5, "output_length": 1, '
         '"hash_ids": []}\n', 3, "input_length must be a positive integer, got 5.5"),
    ],
)  # fmt: skip
def test_adapter_errors_name_file_line_and_reason(tmp_path, file_name, text, line, reason):
    path = write(tmp_path / file_name, text)
    fmt = "azure" if file_name.endswith(".csv") else "mooncake"
    with pytest.raises(TraceFormatError) as info:
        load_workload(str(path), format=fmt)
    assert str(info.value) == f"{path}:{line}: {reason}"


# --- ServeGen tenants -----------------------------------------------------------


def test_servegen_clients_are_the_43_m_small_language_clients_busiest_first():
    rates = servegen_client_rates()
    assert len(rates) == 43
    assert list(rates)[:3] == ["m-small/chunk-5", "m-small/chunk-38", "m-small/chunk-17"]
    values = list(rates.values())
    assert values == sorted(values, reverse=True)
    assert values[0] == pytest.approx(350.873, rel=1e-5)
    assert (DATA_DIR / "servegen" / "servegen_deepseek-r1_and_m-small.tar.gz").is_file()


def test_tenants_follow_the_busiest_clients_rate_mix(builtin):
    trace = builtin["azure-conv"]
    tenanted = assign_servegen_tenants(trace, num_tenants=7, seed=0)
    counts = Counter(r.tenant for r in tenanted.requests)
    weights = list(servegen_client_rates().values())[:7]
    total = len(trace.requests)
    assert set(counts) == {f"t{i}" for i in range(7)}
    for i, weight in enumerate(weights):
        expected = weight / sum(weights)
        sigma = math.sqrt(expected * (1 - expected) / total)
        assert abs(counts[f"t{i}"] / total - expected) < 5 * sigma
    assert counts.most_common(1)[0][0] == "t0"
    assert [attrs.evolve(r, tenant=None) for r in tenanted.requests] == list(trace.requests)


def test_tenant_assignment_is_a_function_of_trace_count_and_seed(builtin):
    trace = builtin["azure-code"].head(500)
    first = assign_servegen_tenants(trace, num_tenants=3, seed=11)
    assert first == assign_servegen_tenants(trace, num_tenants=3, seed=11)
    assert first != assign_servegen_tenants(trace, num_tenants=3, seed=12)
    assert {r.tenant for r in first.requests} == {"t0", "t1", "t2"}
    assert {r.tenant for r in assign_servegen_tenants(trace, num_tenants=1).requests} == {"t0"}


@pytest.mark.parametrize("num_tenants", [0, 44, 2.0])
def test_tenant_count_must_fit_the_client_pool(builtin, num_tenants):
    with pytest.raises(ValueError) as info:
        assign_servegen_tenants(builtin["azure-code"], num_tenants=num_tenants)
    assert str(info.value) == f"num_tenants must be between 1 and 43, got {num_tenants!r}"


def test_enterprise_workload_is_deterministic_and_has_seven_tiered_tenants():
    from benchmarks.replay.enterprise import TENANTS, enterprise_trace
    from benchmarks.replay.workloads import load_workload

    trace = load_workload("enterprise")
    assert trace == enterprise_trace(seed=0)
    assert trace != enterprise_trace(seed=1)
    tenants = {r.tenant for r in trace.requests}
    assert tenants == {t.name for t in TENANTS}
    assert {r.slo_class for r in trace.requests} == {"gold", "silver", "bronze"}
    assert any(r.cancel_after_s for r in trace.requests)
    assert all(r.block_hashes and r.prompt_tokens >= 512 for r in trace.requests)
    assert 0 < trace.duration_s <= 300
