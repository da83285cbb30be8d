"""The live business case: prompts built from the workload, the HTTP client's outcomes
against a stub server, and one tiny live run through a real CPU vLLM server."""

import asyncio
import json
import os

import attrs
import pytest
from aiohttp import web

from benchmarks.e2e_business_cases.live import WARM_UP_PROMPT, LiveScale, live_requests
from benchmarks.e2e_business_cases.live_client import (
    STOP_TOKEN_ID,
    HttpReply,
    LiveRequest,
    client_priority,
    parse_gauges,
    play,
    request_body,
)
from benchmarks.e2e_business_cases.workload import (
    BASE_RATE_SCALE,
    PHASES,
    SWITCH_TENANT,
    business_workload,
)
from benchmarks.gpu.validate import LLAMA3_8B_SHAPE, run_validation
from benchmarks.replay.trace import TraceRequest
from integrations.vllm_v1.instruments.step_log import read_step_log
from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir

SCALE = LiveScale(phase_s=2.0)


def test_prompts_fit_the_model_and_share_the_tenant_prefix_until_the_switch():
    workload = business_workload(phase_s=SCALE.phase_s, rate_scale=SCALE.rate_scale)
    requests = live_requests(workload, SCALE)
    assert len(requests) == len(workload.trace.requests)
    assert all(len(r.prompt_token_ids) + r.max_tokens <= SCALE.max_model_len for r in requests)
    assert all(1 <= r.max_tokens <= SCALE.max_output_tokens for r in requests)
    prefix = 32 * 2  # 32 system-prompt blocks of 16 tokens, scaled by 1/8
    switched = [r for r in requests if r.request.tenant == SWITCH_TENANT]
    before = {r.prompt_token_ids[:prefix] for r in switched
              if r.request.arrival_s < workload.switch_s}
    after = {r.prompt_token_ids[:prefix] for r in switched
             if r.request.arrival_s >= workload.switch_s}
    assert len(before) == 1 and len(after) == 1 and before != after
    cancels = [r for r in requests if r.request.cancel_after_s is not None]
    assert cancels and all(r.cancel_after_s == r.request.cancel_after_s for r in cancels), (
        "a client's patience is real seconds, as its SLO")


def test_a_loaded_scale_offers_more_requests_in_every_phase():
    loaded = SCALE.loaded(4.0)
    assert loaded.rate_scale == 4 * SCALE.rate_scale and loaded.phase_s == SCALE.phase_s
    base = business_workload(phase_s=SCALE.phase_s, rate_scale=SCALE.rate_scale, seed=1)
    more = business_workload(phase_s=loaded.phase_s, rate_scale=loaded.rate_scale, seed=1)
    assert len(more.trace.requests) > 3 * len(base.trace.requests)
    with pytest.raises(ValueError, match="load must be > 0"):
        SCALE.loaded(0)


def test_metrics_page_gauges_become_an_engine_sample():
    page = ('# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{model="m"} 7.0\n'
            'vllm:num_requests_running{model="m"} 3.0\n'
            'vllm:kv_cache_usage_perc{model="m"} 0.25\n')
    sample = parse_gauges(page, 1.5)
    assert (sample.time_s, sample.waiting, sample.running, sample.kv_usage) == (1.5, 7, 3, 0.25)


def _event(payload):
    return f"data: {json.dumps(payload)}\n\n".encode()


_BODIES = {}


async def _stub(request):
    """Answers by the prompt's first token: 1 -> 503, 2 -> empty stream, 3 -> never ends,
    4 -> three chunks and the usage."""
    body = await request.json()
    kind = body["prompt"][0]
    _BODIES[kind] = body
    if kind == 1:
        return web.json_response(
            {"error": {"message": "request rejected by the scheduler: queue_full; retry after "
                                  "2 s"}}, status=503, headers={"Retry-After": "2"})
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    if kind == 3:
        await response.write(_event({"choices": [{"text": "a", "finish_reason": None}]}))
        await asyncio.Event().wait()  # until the client closes the stream
    if kind == 4:
        for text, finish in (("a", None), ("", None), ("b", "length")):
            await response.write(_event({"choices": [{"text": text, "finish_reason": finish}]}))
        await response.write(_event({"choices": [], "usage": {
            "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}}))
    await response.write(b"data: [DONE]\n\n")
    return response


def _live(kind, **fields):
    request = TraceRequest(request_id=f"r{kind}", arrival_s=0.0, prompt_tokens=40,
                           output_tokens=4, tenant="acme-bank", slo_class="gold")
    return LiveRequest(request=request, prompt_token_ids=(kind, 9, 9, 9), max_tokens=4,
                       **fields)


async def _play_against_stub(requests, **options):
    app = web.Application()
    app.router.add_post("/v1/completions", _stub)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        return await play(f"http://127.0.0.1:{port}", "m", requests, with_priority=True,
                          sample_every_s=60.0, **options)
    finally:
        await runner.cleanup()


def test_client_classifies_rejections_empty_streams_cancels_and_completions():
    requests = [_live(1), _live(2), _live(3, cancel_after_s=0.2), _live(4)]
    records, _ = asyncio.run(_play_against_stub(requests))
    by_id = {r.request_id: r for r in records}
    assert (by_id["r1"].outcome, by_id["r1"].reason) == ("rejected",
                                                         "rejected:queue_full;retry_after_s=2")
    assert (by_id["r2"].outcome, by_id["r2"].reason) == ("rejected", "rejected:empty_stream")
    assert by_id["r3"].outcome == "cancelled"
    done = by_id["r4"]
    assert done.outcome == "completed"
    assert len(done.token_times_s) == 4  # three chunks, four tokens by the usage
    assert done.cached_tokens == 20  # 2 of 4 live prompt tokens -> half of 40


def test_replies_keep_the_http_status_retry_after_and_reason_on_fresh_connections():
    requests = [_live(1), _live(4)]
    replies = [HttpReply() for _ in requests]
    records, _ = asyncio.run(_play_against_stub(requests, replies=replies,
                                                fresh_connections=True))
    rejected, done = replies
    assert (rejected.status, rejected.retry_after) == (503, "2")
    assert "queue_full" in rejected.body
    assert (done.status, done.retry_after, done.body) == (200, None, "")
    assert all(reply.send_lag_s >= 0 for reply in replies)
    assert [r.outcome for r in records] == ["rejected", "completed"]


def test_a_client_hiding_the_length_asks_for_the_context_and_ends_the_answer_by_a_stop_token():
    records, _ = asyncio.run(_play_against_stub([_live(4)], max_tokens="context",
                                                max_model_len=64))
    body = _BODIES[4]
    assert body["max_tokens"] == 64 - 4  # the rest of the context, not the answer's 4
    assert body["min_tokens"] == 3 and body["stop_token_ids"] == [STOP_TOKEN_ID]
    assert body["logit_bias"] == {str(STOP_TOKEN_ID): 100}  # the 4th token is the stop
    assert records[0].outcome == "completed"
    output_body = request_body(_live(4), "m", with_priority=False)
    assert output_body["max_tokens"] == 4 and "min_tokens" not in output_body


@pytest.mark.engine
def test_a_tiny_live_run_conserves_every_request_and_calibrates(tmp_path):
    """The GPU validation's own code path (`run_validation`) on the tiny CPU model."""
    scale = attrs.evolve(SCALE, rate_scale=BASE_RATE_SCALE)
    summary = run_validation(tmp_path, scale=scale, model=str(tiny_model_dir("dummy")),
                             systems=("pipeline+fixes",))
    steps = read_step_log(tmp_path / "step_logs" / "pipeline+fixes.jsonl")
    phases = [p["systems"]["pipeline+fixes"] for p in summary["phases"]]
    played = [e for e in steps
              if e["event"] == "add" and tuple(e["prompt_token_ids"]) != WARM_UP_PROMPT]
    assert len(played) == sum(e["event"] == "add" for e in steps) - 1  # and the warm-up
    # every completed request reached the engine; a client may cancel one before it does
    assert sum(m["completed"] for m in phases) <= len(played) <= summary["config"]["requests"]
    assert summary["calibration"]["samples"] == sum(
        e["event"] == "step" and e["duration_s"] > 0 for e in steps) > 0
    assert json.loads((tmp_path / "cost_model.json").read_text()) == (
        summary["calibration"]["cost_model"])
    assert json.loads((tmp_path / "live_summary.json").read_text())["phases"] == summary["phases"]
    assert "Gold short-request TTFT p99" in (tmp_path / "live_report.md").read_text()
    assert [p["name"] for p in summary["phases"]] == [p.name for p in PHASES]
    offered = len(business_workload(phase_s=scale.phase_s, rate_scale=scale.rate_scale)
                  .trace.requests)
    assert sum(m["offered"] for m in phases) == offered == summary["config"]["requests"]
    for m in phases:
        assert m["completed"] + m["rejected"] + m["cancelled"] == m["offered"]
        assert m["admitted"] + m["rejected"] == m["offered"]
        assert set(m["ttft_p99_s_by_tier"]) == {"gold", "silver", "bronze"}
    assert sum(m["completed"] for m in phases) > 0
    timings = summary["live"]["systems"]["pipeline+fixes"]
    assert timings["played_s"] > 0 and 0 <= timings["stall_longest_s"] <= timings["stall_s"]


def test_gpu_validation_runs_llama3_8b_layers_at_the_study_shape():
    from benchmarks.e2e_business_cases.study import SHAPE
    from benchmarks.gpu.validate import GPU_SCALE

    config = LLAMA3_8B_SHAPE.config()
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
            config["num_attention_heads"], config["num_key_value_heads"]) == (
        4096, 32, 14336, 32, 8)
    assert (GPU_SCALE.max_num_seqs, GPU_SCALE.max_num_batched_tokens,
            GPU_SCALE.max_model_len) == (SHAPE.max_num_seqs, SHAPE.max_num_batched_tokens,
                                         SHAPE.max_model_len)
    args = GPU_SCALE.vllm_args()
    assert "--enforce-eager" not in args and "--no-async-scheduling" in args
    assert args[args.index("--dtype") + 1] == "bfloat16"


def test_the_client_runs_at_a_higher_priority_while_open_and_restores_it_after():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with client_priority(before - 1) as raised:
        inside = os.getpriority(os.PRIO_PROCESS, 0)
    after = os.getpriority(os.PRIO_PROCESS, 0)
    assert after == before
    assert inside == (before - 1 if raised else before)


def test_a_client_not_permitted_a_higher_priority_changes_nothing_and_warns(monkeypatch, caplog):
    def refuse(*_args):
        raise PermissionError("needs CAP_SYS_NICE")

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level("WARNING"), client_priority() as raised:
        assert not raised
    assert "normal priority" in caplog.text
