"""Replays never hang: too-long prompts are refused as vLLM's API does, a stuck replay is
an error naming the stuck requests, and malformed trace input fails at its line.

Each of these hung or failed without a line number before (the replay stepped forever on
a prompt longer than ``max_model_len``; an undecodable byte, a corrupt gzip stream or a
NUL in a CSV raised a bare codec/zlib/csv error; a key given twice was silently taken).
"""

import gzip
import json

import pytest

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.datasets import load_azure_csv, load_mooncake_jsonl
from benchmarks.replay.driver import ReplayStalled, replay
from benchmarks.replay.metrics import summarize
from benchmarks.replay.trace import Trace, TraceFormatError, TraceRequest, load_jsonl
from benchmarks.replay.workloads import load_workload
from integrations.vllm_v1.instruments import EngineShape
from integrations.vllm_v1.rejection import Rejection

COST = StepCostModel.preset("h100")
SHAPE = EngineShape(num_blocks=256, max_num_batched_tokens=512, max_num_seqs=16,
                    max_model_len=2048)


def req(i, arrival, prompt, output=8):
    return TraceRequest(request_id=f"r{i}", arrival_s=arrival, prompt_tokens=prompt,
                        output_tokens=output)


@pytest.mark.timeout(120)
def test_prompts_that_leave_no_room_are_rejected_like_vllms_api():
    trace = Trace(name="t", requests=(
        req(0, 0.0, 5000),            # longer than max_model_len: vLLM answers 400
        req(1, 0.0, 100),
        req(2, 0.1, 2048),            # exactly max_model_len: no room for one output token
        req(3, 0.2, 2047, output=50),  # one token of room: max_tokens clamped to 1
        req(4, 0.3, 10**12),          # absurd, and must not be materialised as token ids
    ))
    run = replay(trace, "fcfs", shape=SHAPE, cost_model=COST)
    by_id = {r.request_id: r for r in run.records}
    assert {i for i, r in by_id.items() if r.outcome == "rejected"} == {"r0", "r2", "r4"}
    for i in ("r0", "r2", "r4"):
        rejection = Rejection.parse(by_id[i].reason)
        assert rejection.reason == "prompt_too_long" and rejection.http_status == 400
        assert by_id[i].finish_s == by_id[i].arrival_s and not by_id[i].token_times_s
    assert by_id["r1"].outcome == "completed" and len(by_id["r1"].token_times_s) == 8
    assert by_id["r3"].outcome == "completed" and len(by_id["r3"].token_times_s) == 1
    summary = summarize(run)
    assert summary["rejections_by_reason"] == {"rejected:prompt_too_long": 3}


@pytest.mark.timeout(300)
def test_real_mooncake_prompts_over_the_default_context_are_rejected():
    trace = load_workload("mooncake-conv", max_requests=40)
    too_long = {r.request_id for r in trace.requests if r.prompt_tokens >= 32768}
    assert too_long  # the real trace has them in its first 40 requests
    shape = EngineShape(num_blocks=6000)  # default max_model_len 32,768
    run = replay(trace, "fcfs", shape=shape, cost_model=COST)
    assert {r.request_id for r in run.records if r.outcome == "rejected"} == too_long
    assert sum(r.outcome == "completed" for r in run.records) == 40 - len(too_long)


@pytest.mark.timeout(120)
def test_a_request_that_can_never_run_stops_the_replay_with_its_name():
    # fits max_model_len, but not the 64-block KV cache: vLLM can never schedule it
    trace = Trace(name="t", requests=(req(0, 0.0, 50), req(1, 0.0, 1500), req(2, 5.0, 40)))
    shape = EngineShape(num_blocks=64, max_num_batched_tokens=512, max_model_len=2048)
    with pytest.raises(ReplayStalled, match=r"stuck: r1 \(waiting, 1500 prompt tokens, "
                                            r"0 computed, needs 94 of 64 KV blocks\)") as info:
        replay(trace, "fcfs", shape=shape, cost_model=COST, max_idle_steps=500)
    assert info.value.stuck == ["r1", "r2"] or info.value.stuck == ["r1"]
    assert "500 steps in a row" in str(info.value)


@pytest.mark.timeout(120)
def test_the_watchdog_leaves_throttled_replays_alone(tmp_path):
    # a token bucket that refills slowly makes idle steps, but each request progresses
    spec = tmp_path / "slow.py"
    spec.write_text("from integrations.vllm_v1 import Pipeline\n"
                    "from policies import TokenBucket\n"
                    "PIPE = Pipeline(rate=TokenBucket(capacity_tokens=64, min_refill_per_s=64.0,"
                    " max_refill_per_s=64.0))\n")
    trace = Trace(name="t", requests=(req(0, 0.0, 600), req(1, 0.0, 600)))
    run = replay(trace, f"pipeline:{spec}:PIPE", shape=SHAPE, cost_model=COST,
                 max_idle_steps=2000)
    assert {r.outcome for r in run.records} == {"completed"}
    assert run.idle_steps > 0


def test_max_idle_steps_is_validated():
    with pytest.raises(ValueError, match="max_idle_steps must be >= 1"):
        replay(Trace(name="t", requests=()), "fcfs", shape=SHAPE, cost_model=COST,
               max_idle_steps=0)


# -- malformed input fails at its line ---------------------------------------------------


def _jsonl(tmp_path, lines: list[bytes], name="t.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


GOOD = json.dumps({"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}).encode()


def test_undecodable_bytes_name_their_line(tmp_path):
    path = _jsonl(tmp_path, [GOOD, GOOD, b'{"arrival_s": 1, "prompt_tokens": 5, "tenant": "\xff"}'])
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: not UTF-8 text"):
        load_jsonl(path)
    with pytest.raises(TraceFormatError, match=r":3: not UTF-8 text"):
        load_workload(path)


def test_undecodable_first_line_is_named_when_sniffing_the_format(tmp_path):
    path = _jsonl(tmp_path, [b"\xfe\xff binary"], name="t.bin")
    with pytest.raises(TraceFormatError, match=r"t\.bin:1: not UTF-8 text"):
        load_workload(path)


def test_a_truncated_gzip_trace_names_the_line_it_stopped_at(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    whole = gzip.compress(b"\n".join([GOOD] * 4000) + b"\n")
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError, match=r"t\.jsonl\.gz:\d+: cannot read the gzip stream"):
        load_jsonl(path)


def test_a_key_given_twice_is_an_error(tmp_path):
    path = _jsonl(tmp_path, [GOOD, b'{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, '
                                   b'"prompt_tokens": 50000}'])
    with pytest.raises(TraceFormatError, match=r":2: key 'prompt_tokens' given twice"):
        load_jsonl(path)


def test_deeply_nested_json_is_a_format_error(tmp_path):
    path = _jsonl(tmp_path, [GOOD, b"[" * 100_000 + b"]" * 100_000])
    with pytest.raises(TraceFormatError, match=r":2: invalid JSON: nested too deeply"):
        load_jsonl(path)


def test_mooncake_lines_get_the_same_checks(tmp_path):
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 3,
                       "hash_ids": [1, 2]}).encode()
    path = _jsonl(tmp_path, [good, b'{"timestamp": 1, "timestamp": 2, "input_length": 5, '
                                   b'"output_length": 1, "hash_ids": []}'])
    with pytest.raises(TraceFormatError, match=r":2: key 'timestamp' given twice"):
        load_mooncake_jsonl(path)
    path = _jsonl(tmp_path, [good, good, b"\x80"], name="m.jsonl")
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:3: not UTF-8 text"):
        load_mooncake_jsonl(path)


HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens"
ROW = b"2023-11-16 18:17:03.9799600,374,44"


def test_an_unterminated_quote_names_the_line_it_opens_on(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"\n".join([HEADER, ROW, b'2023-11-16 18:17:04.0,"12,4', ROW, ROW]))
    with pytest.raises(TraceFormatError, match=r"a\.csv:3: "):
        load_azure_csv(path)
