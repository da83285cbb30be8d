"""The soak benchmark's accounting (every offered request has exactly one known outcome) and
its memory report (growth judged against the KV cache)."""

import os
from collections import Counter

from benchmarks.soak import MemoryTrace, accounting, process_memory_mb, verdict


def test_offered_is_completed_rejected_cancelled_and_invalid():
    counts = accounting(Counter(completed=5, rejected=2, cancelled=3, invalid=1))
    assert counts["offered"] == 11 and counts["balanced"]
    assert counts["unexpected"] == 0


def test_an_unexpected_outcome_breaks_the_balance():
    assert not accounting(Counter(completed=5, unexpected=1))["balanced"]


def test_memory_growth_is_judged_by_whether_it_levels_off():
    assert verdict(10.0, tail_growth_mb=0.0) == "flat"
    assert verdict(120.0, tail_growth_mb=4.0) == "levels off"
    assert verdict(120.0, tail_growth_mb=40.0) == "still growing"


def test_this_process_memory_is_read_from_proc():
    memory = process_memory_mb(os.getpid())
    assert memory["rss"] >= memory["anon"] > 0 and memory["file"] >= 0


KV_TOKENS = 65536


def sample(t_s, phase, anon, tokens):
    return {"t_s": t_s, "phase": phase, "kv_usage": 0.01, "kv_tokens_written": tokens,
            "processes": {"worker": {"rss": anon + 100.0, "anon": anon, "file": 100.0}}}


def report(anon_at, tokens_at):
    """The report of 14 samples 5 s apart (two of warm-up), memory and tokens by index."""
    trace = MemoryTrace("http://127.0.0.1:1", os.getpid(), every_s=5.0)
    trace.samples = [sample(5.0 * i, "soak" if i > 1 else "warmup", anon_at(i), tokens_at(i))
                     for i in range(14)]
    result = trace.report(128.0, KV_TOKENS)
    return result["processes"]["worker"], result


def test_growth_that_levels_off_is_no_leak():
    worker, result = report(lambda i: 500.0 + min(20.0 * i, 120.0), lambda i: 10240 * i)
    assert (worker["verdict"], result["leak_suspects"], result["kv_full_at_s"]) == (
        "levels off", [], 35.0)  # 71,680 tokens written by the 8th sample
    assert worker["anon_mb"] == {"startup": 500.0, "warm": 540.0, "end": 620.0}
    assert worker["anon_growth_after_kv_full_mb"] == 0.0  # it stopped with the KV pages


def test_growth_after_the_kv_cache_was_written_through_is_a_leak_suspect():
    worker, result = report(lambda i: 500.0 + 8.0 * i, lambda i: 2 * KV_TOKENS)
    assert (worker["verdict"], result["leak_suspects"]) == ("still growing", ["worker"])
    assert worker["anon_growth_after_kv_full_mb"] == 104.0
    assert worker["tail_mb_per_min"] == 96.0  # 8 MiB per 5 s
