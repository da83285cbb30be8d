"""The live overload benchmark's pure parts: the arrival schedule, the request mix, the
client-side judgement of each run, the goals and the run order."""

import json
import os
import random
import statistics
import time
from types import SimpleNamespace

import attrs
import pytest

from benchmarks.e2e_business_cases.live_client import HttpReply
from benchmarks.live_slo.__main__ import (
    QUICK,
    build_parser,
    console_table,
    settings_from,
    stalled,
)
from benchmarks.live_slo.plots import load_series
from benchmarks.live_slo.run import Contention, queue_cap_systems, run_order, search_capacity
from benchmarks.live_slo.summary import SPEC, evaluate_goals, judged_class, run_metrics
from benchmarks.live_slo.workload import (
    RAG_PROMPT_TOKENS,
    SYSTEM_PROMPT_TOKENS,
    Scenario,
    build_requests,
    poisson_arrivals,
)
from benchmarks.replay.records import RequestRecord
from benchmarks.replay.trace import TraceRequest


def test_poisson_arrivals_are_ascending_in_the_window_and_average_the_rate():
    counts = []
    for seed in range(200):
        times = poisson_arrivals(5.0, 10.0, random.Random(seed))
        assert times == sorted(times) and all(0 <= t < 10.0 for t in times)
        counts.append(len(times))
    assert abs(statistics.mean(counts) - 50) < 2  # mean 50, sd of the mean 0.5
    assert 4 < statistics.stdev(counts) < 10  # Poisson: sd sqrt(50) ~ 7
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 0
    assert poisson_arrivals(5.0, 10.0, random.Random(1)) == poisson_arrivals(
        5.0, 10.0, random.Random(1))
    with pytest.raises(ValueError, match="rate_rps and duration_s must be > 0"):
        poisson_arrivals(0.0, 10.0, random.Random(0))


def test_scenarios_need_exactly_one_load_and_bursts_scale_with_capacity():
    with pytest.raises(ValueError, match="exactly one of load, burst and burst_s"):
        Scenario(name="x", load=1.0, burst=5, duration_s=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        Scenario(name="x")
    with pytest.raises(ValueError, match="load and duration_s must be > 0"):
        Scenario(name="x", load=2.0)
    rng = random.Random(0)
    assert Scenario(name="b", burst_s=10.0).arrivals(3.26, rng) == [0.0] * 33
    assert Scenario(name="b", burst=7).arrivals(3.26, rng) == [0.0] * 7
    poisson = Scenario(name="p", load=2.0, duration_s=30.0)
    assert 150 < len(poisson.arrivals(5.0, rng)) < 450
    assert poisson.window_s([1.0]) == 30.0 and Scenario(name="b", burst=3).window_s([0.0]) == 1


def test_requests_mix_classes_and_tenants_and_share_each_tenants_prefix():
    requests = build_requests([0.1 * i for i in range(600)], seed=3)
    assert build_requests([0.0, 1.0], seed=3)[1].prompt_token_ids == requests[1].prompt_token_ids
    kinds = [r.request.slo_class for r in requests]
    assert 0.5 < kinds.count("chat") / 600 < 0.7
    assert 0.1 < kinds.count("rag") / 600 < 0.3 and 0.1 < kinds.count(None) / 600 < 0.3
    assert {r.request.tenant for r in requests} == {"acme", "globex"}
    for live in requests:
        assert len(live.prompt_token_ids) == live.request.prompt_tokens
        assert live.max_tokens == live.request.output_tokens
        if live.request.slo_class == "rag":
            assert RAG_PROMPT_TOKENS[0] <= live.request.prompt_tokens <= RAG_PROMPT_TOKENS[1]
    prefixes = {}
    for live in requests:
        prefixes.setdefault(live.request.tenant, set()).add(
            live.prompt_token_ids[:SYSTEM_PROMPT_TOKENS])
    assert all(len(p) == 1 for p in prefixes.values())
    assert prefixes["acme"] != prefixes["globex"]
    assert len({r.prompt_token_ids[SYSTEM_PROMPT_TOKENS:][:8] for r in requests}) == 600


def _record(i, *, cls="chat", prompt=100, ttft=None, tpot=0.01, tokens=4, outcome="completed",
            rejected_after=None, tenant="acme"):
    record = RequestRecord(request_id=f"r{i}", arrival_s=1.0, prompt_tokens=prompt,
                           output_tokens=tokens, tenant=tenant, priority=0, slo_class=cls)
    if rejected_after is not None:
        record.finish("rejected", 1.0 + rejected_after, "rejected:slo_infeasible")
        return record
    if ttft is not None:
        record.token_times_s = [1.0 + ttft + k * tpot for k in range(tokens)]
    record.finish(outcome, record.token_times_s[-1] if record.token_times_s else 9.0)
    return record


def _reply(record):
    if record.outcome == "rejected":
        return HttpReply(send_lag_s=0.0, status=503, retry_after="1", body="x")
    return HttpReply(send_lag_s=0.0, status=200)


def test_a_run_is_judged_per_class_on_the_client():
    records = [
        _record(0, ttft=0.4),                       # chat, met
        _record(1, ttft=0.6),                       # chat, TTFT missed
        _record(2, ttft=0.1, tpot=0.06),            # chat, TPOT missed
        _record(3, cls="rag", prompt=1200, ttft=1.9),  # rag, met
        _record(4, cls=None, prompt=300, ttft=0.7, tenant="initech"),  # no class: rag
        _record(5, ttft=None, outcome="cancelled"),  # admitted, no token
        _record(6, rejected_after=0.05),            # chat, rejected in time
        _record(7, cls="rag", rejected_after=2.5),  # rag, rejected too late
    ]
    # as the server classes it: an undeclared tenant may not claim the protected chat
    assert judged_class(records[4]) == "rag"
    assert judged_class(_record(9, cls=None, prompt=300)) == "chat"  # acme's own class
    named = RequestRecord(request_id="n", arrival_s=1.0, prompt_tokens=300, output_tokens=4,
                          tenant="initech", priority=0, slo_class=None)
    granted = attrs.evolve(SPEC, allowed={"initech": frozenset({"chat", "rag"})})
    assert judged_class(named, granted) == "chat"
    long_plain = _record(8, cls=None, prompt=5000, ttft=1.0, tenant="initech")
    assert judged_class(long_plain) == "rag"
    metrics = run_metrics(records, [_reply(r) for r in records], window_s=2.0)
    assert (metrics["offered"], metrics["admitted"], metrics["rejected"], metrics["met"]) == (
        8, 6, 2, 3)
    assert metrics["admitted_slo_attainment"] == pytest.approx(3 / 6)
    assert metrics["goodput_rps"] == pytest.approx(1.5)
    assert metrics["rejected_in_time_share"] == 0.5
    assert metrics["time_to_rejection_p99_s"] == pytest.approx(2.5, abs=0.03)
    assert metrics["admitted_without_token"] == 1
    assert metrics["rejections_with_retry_after"] == 2
    assert metrics["statuses"] == {"200": 6, "503": 2}
    assert metrics["by_class"]["rag"] == {"offered": 2, "admitted": 1, "met": 1}
    assert metrics["by_class"]["none"] == {"offered": 1, "admitted": 1, "met": 1}
    with pytest.raises(ValueError, match="window_s must be > 0"):
        run_metrics(records, [_reply(r) for r in records], window_s=0)


def _metrics(attainment, goodput, in_time=None):
    return {"admitted_slo_attainment": attainment, "goodput_rps": goodput,
            "rejected_in_time_share": in_time}


def test_goals_hold_the_preset_to_the_best_stock_system_on_every_seed():
    scenarios = {"1x": {"load": 1.0, "contention": False},
                 "2x": {"load": 2.0, "contention": False},
                 "burst": {"load": None, "contention": False},
                 "2x-busy": {"load": 2.0, "contention": True}}
    runs = {
        "1x": {"0": {"slo": _metrics(0.99, 9.8), "fcfs": _metrics(1.0, 10.0)}},
        "2x": {"0": {"slo": _metrics(0.96, 12.0), "fcfs": {**_metrics(0.5, 8.0), "stall_s": 9.0},
                     "priority": {**_metrics(0.7, 12.5), "stall_s": 2.5}},
               "1": {"fcfs": _metrics(0.5, 8.0)}},  # no slo run: no goal
        "burst": {"0": {"slo": _metrics(0.97, 30.0, in_time=0.99), "fcfs": _metrics(0.2, 5)}},
        "2x-busy": {"0": {"slo": _metrics(0.94, 9.0), "fcfs": _metrics(0.4, 5.0)}},
    }
    goals = {(g["scenario"], g["goal"]): g for g in evaluate_goals(runs, scenarios)}
    assert len(goals) == 6
    assert goals[("1x", "goodput >= 0.97x best stock")]["met"]
    assert goals[("1x", "goodput >= 0.97x best stock")]["bound"] == pytest.approx(9.7)
    assert goals[("2x", "admitted attainment")]["met"]
    best = goals[("2x", "goodput >= best stock")]
    assert (best["met"], best["best_stock"], best["bound"]) == (False, "priority", 12.5)
    # the goal says how long the client stood still in the runs it compares (not fcfs's)
    assert best["stall_s"] == 2.5 and goals[("2x", "admitted attainment")]["stall_s"] == 0
    assert stalled(best) == " (the client stood still 2.5 s)"
    assert stalled(goals[("2x", "admitted attainment")]) == ""
    assert goals[("burst", "admitted attainment")]["met"]
    assert not goals[("burst", "rejections within their TTFT target")]["met"]
    assert not goals[("2x-busy", "admitted attainment")]["met"]


def test_queue_caps_follow_capacity_and_the_run_order_interleaves_systems():
    assert queue_cap_systems(7.0) == ["stock+queue-caps:priority:reqs=4",
                                      "stock+queue-caps:priority:reqs=7",
                                      "stock+queue-caps:priority:reqs=14"]
    assert queue_cap_systems(1.0, (0.5, 1.0)) == ["stock+queue-caps:priority:reqs=1"]
    one, two = Scenario(name="1x", load=1.0, duration_s=1.0), Scenario(name="b", burst=2)
    order = run_order([0, 1], [one, two], ["slo", "fcfs"], server_per_run=True)
    assert [(s, sc.name, sy) for s, sc, sy in order][:4] == [
        (0, "1x", "slo"), (0, "1x", "fcfs"), (0, "b", "slo"), (0, "b", "fcfs")]
    reused = run_order([0], [one, two], ["slo", "fcfs"], server_per_run=False)
    assert [(sc.name, sy) for _, sc, sy in reused] == [
        ("1x", "slo"), ("b", "slo"), ("1x", "fcfs"), ("b", "fcfs")]


def test_the_command_line_builds_the_settings_and_the_table_reads_a_summary():
    settings = settings_from(build_parser().parse_args(
        ["--out", "x", "--quick", "--seeds", "1,2", "--queue-waits", "", "--capacity-rps",
         "4"]))
    assert settings.seeds == (1, 2) and settings.queue_waits_s == ()
    assert settings.capacity_rps == 4 and settings.scenarios == QUICK.scenarios
    assert settings.stall_retries == 0 and not settings.fresh_connections
    assert settings_from(build_parser().parse_args(
        ["--out", "x", "--stall-retries", "2"])).stall_retries == 2
    assert settings_from(build_parser().parse_args(
        ["--out", "x", "--fresh-connections"])).fresh_connections
    chosen = settings_from(build_parser().parse_args(["--out", "x", "--scenarios", "4x,2x"]))
    assert [scenario.name for scenario in chosen.scenarios] == ["4x", "2x"]
    with pytest.raises(SystemExit, match="unknown 3x"):
        settings_from(build_parser().parse_args(["--out", "x", "--scenarios", "3x"]))
    summary = {"capacity": {"capacity_rps": 4.0},
               "config": {"scenarios": {"1x": {"load": 1.0, "contention": False},
                                        "b": {"load": None, "contention": False}}},
               "runs": {"1x": {"0": {"slo": {**_metrics(1.0, 4.0), "admitted": 40,
                                             "offered": 40, "ttft_p99_s": 0.2}}},
                        "b": {"0": {"slo": {**_metrics(None, 0.0), "admitted": 0,
                                            "offered": 40, "ttft_p99_s": None}}}},
               "goals": []}
    table = console_table(summary)
    assert "1x" in table and "100.0%" in table and "0/40" in table
    assert load_series(summary, "goodput_rps") == {"slo": [(1.0, 4.0)]}


def test_a_finished_run_is_judged_again_from_its_requests(tmp_path):
    from benchmarks.live_slo.rejudge import rejudge
    from benchmarks.live_slo.run import write_requests

    scenario = Scenario(name="1x", load=1.0, duration_s=2.0)
    records = [_record(0, ttft=0.4), _record(4, cls=None, prompt=300, ttft=0.7, tenant="initech"),
               _record(6, rejected_after=0.05)]
    replies = [_reply(r) for r in records]
    lives = [SimpleNamespace(max_tokens=4) for _ in records]
    write_requests(tmp_path / "runs" / "1x" / "seed0" / "slo" / "requests.jsonl", records,
                   replies, lives)
    (tmp_path / "summary.json").write_text(json.dumps({
        "config": {"seeds": [0], "systems": ["slo"], "scenarios": {"1x": attrs.asdict(scenario)}},
        "capacity": {"capacity_rps": 2.0}, "runs": {}, "goals": []}))
    metrics = rejudge(tmp_path)["runs"]["1x"]["0"]["slo"]
    window = scenario.window_s(scenario.arrivals(2.0, random.Random("0:1x")))
    assert metrics == run_metrics(records, replies, window_s=window)
    assert (metrics["admitted"], metrics["met"]) == (2, 2), "the unclassed one is rag: met"


def test_a_noisy_team_sends_its_share_and_the_quiet_team_is_held_to_its_fair_share():
    from benchmarks.live_slo.summary import NOISY_TEAM_SHARES, quiet_team_share

    requests = build_requests([0.0] * 2000, seed=1, tenant_shares=NOISY_TEAM_SHARES)
    noisy = sum(r.request.tenant == "globex" for r in requests) / 2000
    assert 0.72 < noisy < 0.78
    with pytest.raises(ValueError, match="tenant_shares"):
        Scenario(name="x", load=2.0, duration_s=1.0, tenant_shares=(0.5, 0.6))
    run = {"window_s": 10.0, "goodput_rps": 30.0, "admitted_slo_attainment": 0.88,
           "rejected_in_time_share": None, "by_tenant": {"acme": {"offered": 100, "admitted": 90, "met": 88},
                         "globex": {"offered": 300, "admitted": 250, "met": 212}}}
    attainment, goodput, fair = quiet_team_share(run)
    assert attainment == pytest.approx(88 / 90) and goodput == 8.8
    assert fair == 10.0  # it offered 10 req/s, under half of the 30 req/s goodput
    run["by_tenant"]["acme"]["offered"] = 400
    assert quiet_team_share(run)[2] == 15.0  # equal weights: half the goodput
    scenarios = {"2x-noisy-team": {"load": 2.0, "contention": False,
                                   "tenant_shares": NOISY_TEAM_SHARES}}
    goals = evaluate_goals({"2x-noisy-team": {"0": {"slo": run}}}, scenarios)
    assert [(g["goal"], g["met"]) for g in goals] == [
        ("quiet team's admitted attainment", True),
        ("quiet team's goodput >= 0.9x its fair share", False)]  # 8.8 < 0.9 x 15


def test_capacity_rises_until_goodput_falls_then_bisects_toward_the_peak():
    true_capacity = 30.0

    def probe(rate, _index):  # goodput follows the rate up to capacity, then collapses
        return {"goodput_rps": rate if rate <= true_capacity else true_capacity / 2}

    found = search_capacity(probe, progress=lambda _line: None)
    rates = [step["rate_rps"] for step in found["steps"]]
    coarse = [2.0 * 1.5 ** k for k in range(8)]  # 2 ... 34.2, where goodput fell
    assert rates[:8] == pytest.approx(coarse)
    assert len(rates) == 10  # two bisections between 22.8 and 34.2
    assert rates[8] == pytest.approx((coarse[6] * coarse[7]) ** 0.5)  # 27.9: a new peak
    assert rates[9] == pytest.approx((rates[8] * coarse[7]) ** 0.5)  # 30.9: over, fell
    assert found["capacity_rps"] == pytest.approx(rates[8])
    assert found["peak_goodput_rps"] == pytest.approx(rates[8])


def test_a_stall_the_client_lives_through_is_recorded_and_reported():
    from benchmarks.e2e_business_cases.live_client import StallWatch

    def hold_the_interpreter(seconds):  # one C call: no other thread runs meanwhile
        n = 10**6
        started = time.perf_counter()
        sum(range(n))
        per = (time.perf_counter() - started) / n
        sum(range(int(seconds / per)))

    with StallWatch() as quiet:
        time.sleep(0.3)
    with StallWatch() as held:
        time.sleep(0.05)
        hold_the_interpreter(0.8)
    assert quiet.stall_s == 0 and quiet.stalls == []
    assert len(held.stalls) == 1 and 0.4 < held.stall_s == held.longest_s < 5
    record = RequestRecord.offered(TraceRequest(request_id="a", arrival_s=0.0,
                                                prompt_tokens=10, output_tokens=4))
    record.finish("rejected", 0.1, "rejected:queue_full")
    metrics = run_metrics([record], [HttpReply(status=503)], window_s=1.0,
                          stalls=held.stalls)
    assert metrics["stall_s"] == held.stall_s and metrics["stall_longest_s"] == held.longest_s
    assert run_metrics([record], [HttpReply(status=503)], window_s=1.0)["stall_s"] == 0


def test_the_contention_runs_in_a_session_of_its_own_and_stops_on_exit():
    """A busy loop in the client's session would share the client's CPU group (autogroup),
    not contend with the server."""
    with Contention() as contention:
        pid = contention.process.pid
        assert contention.process.poll() is None
        assert os.getsid(pid) == pid != os.getsid(0)
    assert contention.process.poll() is not None
