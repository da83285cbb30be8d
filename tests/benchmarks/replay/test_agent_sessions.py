"""The agent-session generator: growing contexts, shared prefixes, one id per session."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest

from benchmarks.replay.agent_sessions import BLOCK_SIZE, PROFILES, LogNormal, agent_trace
from benchmarks.replay.datasets import assign_servegen_tenants, load_mooncake_jsonl
from benchmarks.replay.workloads import load_workload


@pytest.fixture(scope="module")
def swe():
    return agent_trace("swe", num_requests=1500, seed=3)


def _sessions(trace):
    sessions = defaultdict(list)
    for request in trace.requests:
        sessions[request.session_id].append(request)
    return sessions


def test_each_turn_extends_the_previous_prompt(swe):
    for calls in _sessions(swe).values():
        for before, after in zip(calls, calls[1:], strict=False):
            assert after.arrival_s > before.arrival_s
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens - 1
            full = before.prompt_tokens // BLOCK_SIZE
            assert after.block_hashes[:full] == before.block_hashes[:full]


def test_contexts_grow_to_tens_of_thousands_with_high_reuse(swe):
    longest = max(r.prompt_tokens for r in swe.requests)
    assert 20_000 < longest <= PROFILES["swe"].max_context_tokens
    seen, reused, total = set(), 0, 0
    for request in swe.requests:
        reused += sum(h in seen for h in request.block_hashes)
        total += len(request.block_hashes)
        seen.update(request.block_hashes)
    assert 0.85 < reused / total < 0.97


def test_held_out_variants_differ_from_swe_where_they_say():
    """``swe-long`` grows contexts past ``swe``'s 40k cap; ``swe-busy`` has more, shorter
    sessions on the same number of calls."""
    swe, long, busy = (load_workload(f"agent-{name}", max_requests=1500)
                       for name in ("swe", "swe-long", "swe-busy"))
    assert (PROFILES["swe"].max_context_tokens < max(r.prompt_tokens for r in long.requests)
            <= PROFILES["swe-long"].max_context_tokens)
    assert len(_sessions(busy)) > 1.5 * len(_sessions(swe))
    assert all(r.session_id for r in (*long.requests, *busy.requests))


def test_frameworks_share_their_system_prompt_across_sessions(swe):
    firsts = [calls[0].block_hashes[0] for calls in _sessions(swe).values()]
    assert len(set(firsts)) <= PROFILES["swe"].frameworks < len(firsts)


def test_deterministic_in_the_seed_and_cut_at_num_requests():
    assert agent_trace("bfcl", num_requests=200, seed=1) == agent_trace(
        "bfcl", num_requests=200, seed=1)
    assert agent_trace("bfcl", num_requests=200, seed=1) != agent_trace(
        "bfcl", num_requests=200, seed=2)
    assert len(agent_trace("bfcl", num_requests=200).requests) == 200
    assert len(load_workload("agent-bfcl", max_requests=50).requests) == 50


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="unknown agent profile 'chat'"):
        agent_trace("chat")
    with pytest.raises(ValueError, match="num_requests must be a positive integer"):
        agent_trace("swe", num_requests=0)
    with pytest.raises(ValueError, match="low must be <= high"):
        LogNormal(median=1, sigma=0.1, low=2, high=1)


def test_servegen_tenants_are_drawn_once_per_session(swe):
    tenants = defaultdict(set)
    for request in assign_servegen_tenants(swe).requests:
        tenants[request.session_id].add(request.tenant)
    assert all(len(names) == 1 for names in tenants.values())
    assert len(set().union(*tenants.values())) > 1


def test_mooncake_jsonl_keeps_an_optional_session_id(tmp_path):
    path = tmp_path / "agents.jsonl.gz"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2],
             "session_id": "s-1"},
            {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [1, 3]}]
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    trace = load_mooncake_jsonl(path)
    assert [r.session_id for r in trace.requests] == ["s-1", None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "session_id": ""}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: session_id must be a non-empty string"):
        load_mooncake_jsonl(bad)


def test_a_generated_workload_with_another_seed_is_named_by_its_seed():
    """``agent-<profile>-seed<N>`` loads the same generator with seed N (held-out draws)."""
    other = load_workload("agent-swe-long-seed4", max_requests=50)
    assert other.name == "agent-swe-long-seed4"
    assert other.requests == agent_trace("swe-long", num_requests=50, seed=4).requests
    assert other.requests != load_workload("agent-swe-long", max_requests=50).requests
    with pytest.raises(ValueError, match="agent-nope-seed1"):
        load_workload("agent-nope-seed1")
