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


def test_memory_growth_is_judged_against_the_kv_pages_written():
    assert verdict(10.0, kv_written_mb=128.0) == "flat"
    assert verdict(120.0, kv_written_mb=128.0) == "within the KV cache"
    assert verdict(120.0, kv_written_mb=20.0) == "beyond the KV cache"


def test_this_process_memory_is_read_from_proc():
    memory = process_memory_mb(os.getpid())
    assert memory["rss"] >= memory["anon"] > 0 and memory["file"] >= 0


KV_MB, KV_TOKENS = 128.0, 65536
"""A 128 MiB KV cache of 65,536 tokens: 2 KiB a token."""


def sample(t_s, phase, anon, tokens):
    return {"t_s": t_s, "phase": phase, "kv_usage": 0.01, "kv_tokens_written": tokens,
            "processes": {"worker": {"rss": anon + 100.0, "anon": anon, "file": 100.0}}}


def report(samples):
    trace = MemoryTrace("http://127.0.0.1:1", os.getpid(), every_s=5.0)
    trace.samples = samples
    result = trace.report(KV_MB, KV_TOKENS)
    return result["processes"]["worker"], result


def test_growth_that_follows_the_kv_pages_written_is_explained():
    # 10,240 tokens (20 MiB of KV) a sample: anonymous memory follows until the cache is full
    worker, result = report([sample(5 * i, "soak" if i > 1 else "warmup",
                                    500.0 + min(20.0 * i, 120.0), 10240 * i)
                             for i in range(14)])
    assert (worker["verdict"], worker["growing_at_end"], result["explained"]) == (
        "within the KV cache", False, True)
    assert worker["anon_mb"] == {"startup": 500.0, "warm": 540.0, "end": 620.0}
    assert result["kv_written_mb"] == KV_MB


def test_growth_past_the_kv_pages_written_is_a_leak():
    # the KV cache was written through during the warm-up; memory keeps growing after
    worker, result = report([sample(5 * i, "soak" if i > 1 else "warmup", 500.0 + 30.0 * i,
                                    KV_TOKENS * 2 + 100 * i) for i in range(14)])
    assert (worker["verdict"], worker["growing_at_end"], result["explained"]) == (
        "beyond the KV cache", True, False)
    # still within the KV cache's size in total, but growing while no KV page is new
    worker, result = report([sample(5 * i, "soak" if i > 1 else "warmup", 500.0 + 8.0 * i,
                                    KV_TOKENS * 2) for i in range(14)])
    assert worker["anon_growth_mb"] == 104.0 and worker["verdict"] == "beyond the KV cache"
