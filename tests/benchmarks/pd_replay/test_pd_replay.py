"""The PD cluster replay: every request completes, transfers skip blocks the decode side holds."""

import random

import attrs
import numpy as np
import pytest

from benchmarks.pd_replay.__main__ import SCHEDULING, main, make_router
from benchmarks.pd_replay.cluster import TransferModel, run_cluster
from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.instruments.harness import EngineShape
from policies.pd.router import LeastLoadedRouter

BLOCK = 128
SHAPE = EngineShape(num_blocks=4096, max_model_len=4096, max_num_batched_tokens=2048)
DECODE_SHAPE = EngineShape(num_blocks=4096, max_model_len=4096, max_num_batched_tokens=4096)
PREFILL, DECODE = ["p0", "p1"], ["d0", "d1"]


def conversations(num: int = 7, turns: int = 4) -> Trace:
    """``num`` conversations; turn t repeats the previous turns' blocks and adds three."""
    rng = random.Random(1)
    requests = []
    for c in range(num):
        history: list[int] = []
        for t in range(turns):
            history = history + [c * 100 + t * 3 + k for k in range(3)]
            requests.append(TraceRequest(
                request_id=f"c{c}t{t}", arrival_s=t * 2.0 + c * 0.05 + rng.random() * 0.01,
                prompt_tokens=len(history) * BLOCK + 10, output_tokens=8,
                block_hashes=tuple(history)))
    return Trace(name="conversations", requests=requests, block_size=BLOCK)


def replay(router_name: str, trace: Trace):
    router = make_router(router_name, PREFILL, DECODE, block_size=BLOCK, kv_blocks=4096,
                         seed=0)
    return run_cluster(trace, router, router_name, prefill=PREFILL, decode=DECODE,
                       prefill_shape=SHAPE, decode_shape=DECODE_SHAPE,
                       cost_model=StepCostModel.preset("h100"), transfer=TransferModel())


def test_every_request_completes_with_all_its_tokens():
    result = replay("round_robin", conversations())
    assert {r.outcome for r in result.run.records} == {"completed"}
    assert all(len(r.token_times_s) == r.output_tokens for r in result.run.records)
    assert all(r.ttft_s > 0 for r in result.run.records)
    assert result.transfers == 28 and result.skipped_prefill == 0
    assert 0 < result.kv_bytes_transferred <= result.kv_bytes_full_prompts


def test_prefix_affinity_sends_fewer_kv_bytes_than_round_robin():
    trace = conversations()  # an odd count: round robin moves every conversation each turn
    blind, aware = replay("round_robin", trace), replay("pd_router", trace)
    assert aware.kv_bytes_full_prompts == blind.kv_bytes_full_prompts
    # Turns 2-4 find their earlier turns on the same decode instance.
    assert aware.kv_bytes_transferred < 0.6 * blind.kv_bytes_transferred


def test_a_colocated_cluster_transfers_nothing():
    trace = conversations(num=3, turns=2)
    names = PREFILL + DECODE
    result = run_cluster(trace, LeastLoadedRouter(prefill=(), decode=names), "colocated",
                         prefill=[], decode=names, prefill_shape=SHAPE, decode_shape=SHAPE,
                         cost_model=StepCostModel.preset("h100"), transfer=TransferModel())
    assert result.kv_bytes_transferred == 0 and result.skipped_prefill == 6
    assert {r.outcome for r in result.run.records} == {"completed"}


def test_unknown_router_is_rejected():
    with pytest.raises(ValueError, match="unknown router 'random'"):
        make_router("random", PREFILL, DECODE, block_size=BLOCK, kv_blocks=10, seed=0)


def test_command_line_writes_the_summary(tmp_path):
    from benchmarks.replay.trace import write_jsonl

    path = tmp_path / "conv.jsonl"
    write_jsonl(conversations(num=3, turns=2), path)
    summary = main(["--trace", str(path), "--topologies", "1P1D,2P1D", "--kv-blocks",
                    "2048", "--max-model-len", "4096", "--out", str(tmp_path / "out")])
    assert list(summary["topologies"]) == ["1P1D", "2P1D"]
    routers = ["round_robin", "least_loaded", "pow2", "prefix_affinity", "kv_overlap",
               "pd_router"]
    keys = {"router", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "goodput_rps",
            "goodput_itl_rps", "kv_bytes_transferred"}
    for topology, entry in summary["topologies"].items():
        assert [r["router"] for r in entry["results"]] == routers
        assert all(keys <= set(r) and r["completed"] == 6 for r in entry["results"])
        assert keys <= set(entry["colocated"])
        assert (tmp_path / "out" / entry["plot"]).exists() and topology in entry["plot"]
    assert [r["topology"] for r in summary["results"]] == ["1P1D"] * 6 + ["2P1D"] * 6
    assert (tmp_path / "out" / "summary.json").exists()
    with pytest.raises(SystemExit, match="'2P' is not NPMD"):
        main(["--trace", str(path), "--topologies", "2P", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="unknown --routers"):
        main(["--trace", str(path), "--routers", "pd_router,fast", "--out", str(tmp_path / "x")])


def burst(num: int = 8) -> Trace:
    """Long prompts arriving faster than they decode: the decode instance's context piles up."""
    return Trace(name="burst", block_size=BLOCK, requests=[
        TraceRequest(request_id=f"b{i}", arrival_s=i * 0.05, prompt_tokens=12_000,
                     output_tokens=200, block_hashes=tuple(range(i * 100, i * 100 + 93)))
        for i in range(num)])


def test_pd_roles_complete_every_request_and_the_decode_gate_flattens_itl():
    long_shape = EngineShape(num_blocks=4000, max_model_len=16384, max_num_batched_tokens=8192)
    runs = {}
    for name, (prefill_role, decode_role) in SCHEDULING.items():
        router = make_router("round_robin", ["p0"], ["d0"], block_size=BLOCK, kv_blocks=4000,
                             seed=0)
        runs[name] = run_cluster(burst(), router, name, prefill=["p0"], decode=["d0"],
                                 prefill_shape=long_shape,
                                 decode_shape=attrs.evolve(long_shape,
                                                           max_num_batched_tokens=16384),
                                 cost_model=StepCostModel.preset("h100"),
                                 transfer=TransferModel(), prefill_role=prefill_role,
                                 decode_role=decode_role)
        assert {r.outcome for r in runs[name].run.records} == {"completed"}
    # stock decodes up to five 12k-token contexts at once; the gate (half of 64k tokens) two,
    # so its steps read about as much KV each time, and requests wait longer for their turn
    jitter = {name: itl_jitter(run) for name, run in runs.items()}
    assert jitter["pd"] < 1.01 < 1.04 < jitter["stock"]
    ttft = {name: max(r.ttft_s for r in run.run.records) for name, run in runs.items()}
    assert ttft["pd"] > ttft["stock"]


def itl_jitter(result) -> float:
    """ITL p99 / p50 over every decode gap of every request."""
    gaps = sorted(gap for r in result.run.records for gap in np.diff(r.token_times_s))
    return gaps[int(0.99 * (len(gaps) - 1))] / gaps[len(gaps) // 2]


def test_command_line_runs_each_router_with_each_scheduling(tmp_path):
    from benchmarks.replay.trace import write_jsonl

    path = tmp_path / "conv.jsonl"
    write_jsonl(conversations(num=3, turns=2), path)
    summary = main(["--trace", str(path), "--prefill", "1", "--decode", "1", "--kv-blocks",
                    "2048", "--max-model-len", "4096", "--routers", "pd_router",
                    "--scheduling", "stock,pd", "--no-colocated", "--out", str(tmp_path / "out")])
    assert [r["router"] for r in summary["results"]] == ["pd_router", "pd_router+pd"]
    assert "colocated" not in summary["topologies"]["1P1D"]
    with pytest.raises(SystemExit, match="unknown --scheduling"):
        main(["--trace", str(path), "--scheduling", "fast", "--out", str(tmp_path / "x")])


class RecordingRouter(LeastLoadedRouter):
    """Least-loaded, remembering the loads of every call (what the cluster reported)."""

    seen: list = []
    sessions: list = []

    def route(self, request_id, prompt_tokens, block_keys=(), loads=None, *, session_id=None):
        self.seen.append(dict(loads))
        self.sessions.append(session_id)
        return super().route(request_id, prompt_tokens, block_keys, loads)


@pytest.mark.parametrize("report_assigned", [True, False])
def test_a_decode_instance_reports_what_was_routed_to_it_while_it_prefills(report_assigned):
    # four long prompts at once on one prefill instance: the first three still prefill
    # (or wait for it) when the fourth is routed
    trace = Trace(name="burst", block_size=BLOCK, requests=[
        TraceRequest(request_id=f"b{i}", arrival_s=0.001 * i, prompt_tokens=3000,
                     output_tokens=4, block_hashes=tuple(range(i * 50, i * 50 + 23)))
        for i in range(4)])
    router = RecordingRouter(prefill=["p0"], decode=["d0"])
    router.seen, router.sessions = [], []
    run_cluster(trace, router, "burst", prefill=["p0"], decode=["d0"], prefill_shape=SHAPE,
                decode_shape=DECODE_SHAPE, cost_model=StepCostModel.preset("h100"),
                transfer=TransferModel(), report_assigned=report_assigned)
    last = router.seen[-1]["d0"]
    assert router.seen[-1]["p0"].ongoing_requests == 3
    if report_assigned:
        assert last.running_decodes == 3 and last.ongoing_requests == 3 and last.kv_usage > 0
    else:
        assert last.running_decodes == 0 and last.ongoing_requests == 0 and last.kv_usage == 0


def test_plan_mode_replays_the_planned_split_against_colocation(tmp_path):
    from benchmarks.replay.trace import write_jsonl

    path = tmp_path / "conv.jsonl"
    write_jsonl(conversations(num=5, turns=4), path)  # arrivals over ~6 s
    summary = main(["--trace", str(path), "--plan", "--instances", "3", "--plan-window-s", "3",
                    "--static-splits", "--kv-blocks", "2048", "--max-model-len", "4096",
                    "--out", str(tmp_path / "out")])["plan"]
    assert [w["window"] for w in summary["windows"]] == [0, 1, 2]
    assert sum(w["requests"] for w in summary["windows"]) == 20
    assert all(w["plan"] in {"3C", "1P2D", "2P1D"} for w in summary["windows"])
    assert [r["router"] for r in summary["rows"]] == ["planned", "colocated", "1P2D", "2P1D"]
    assert all(r["completed"] == 20 for r in summary["rows"])
    assert summary["colocated_itl_s"] > summary["itl_slo_s"]  # an 8k chunk step takes > 0.1 s
    assert all("C" not in w["plan"] for w in summary["windows"])  # so the ITL SLO rules it out
    assert summary["goodput_ratio_itl"] is not None
    assert (tmp_path / "out" / "plan.png").exists()


def test_a_sessions_turns_reach_the_router_with_their_session_id():
    trace = conversations(num=3, turns=3)
    trace = attrs.evolve(trace, requests=[attrs.evolve(r, session_id=r.request_id.split("t")[0])
                                          for r in trace.requests])
    router = make_router("pd_router", PREFILL, DECODE, block_size=BLOCK, kv_blocks=4096, seed=0)
    run_cluster(trace, router, "sessions", prefill=PREFILL, decode=DECODE, prefill_shape=SHAPE,
                decode_shape=DECODE_SHAPE, cost_model=StepCostModel.preset("h100"),
                transfer=TransferModel())
    # every later turn (2 of 3 per session) went back to its session's instances
    assert router.stats().decode_reasons["session"] == 6
    recording = RecordingRouter(prefill=PREFILL, decode=DECODE)
    recording.seen, recording.sessions = [], []
    run_cluster(trace, recording, "sessions", prefill=PREFILL, decode=DECODE,
                prefill_shape=SHAPE, decode_shape=DECODE_SHAPE,
                cost_model=StepCostModel.preset("h100"), transfer=TransferModel())
    assert sorted(recording.sessions) == sorted(r.session_id for r in trace.requests)
