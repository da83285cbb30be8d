"""Propose latency against context length, and drafting with a shared cache of 1M+ real tokens.

`context_sweep`: one request whose prompt is the first L tokens of real text (MT-bench answers
of 31 models, concatenated); then ``steps`` decode steps each appending the next real token and
proposing. vLLM's n-gram matcher re-reads the whole context every step (O(L)); the automaton and
arctic's tree do not (arctic matches the last 64 tokens; the automaton keeps a cursor).

`large_cache_replay`: the shared caches are first filled with every MT-bench answer except
GPT-4's (over a million GPT-2 tokens), then the dataset is replayed: propose latency and bytes
per cached token at a realistic cache size.
"""

from __future__ import annotations

import time

import attrs
import numpy as np

from benchmarks.spec_replay.datasets import mt_bench_all_models
from benchmarks.spec_replay.proposers import (
    ArcticProposer,
    NgramProposer,
    ReplayProposer,
    SuffixAutomatonProposer,
    arctic_available,
)
from benchmarks.spec_replay.replay import TokenizedRequest, replay
from policies.percentile import percentile
from policies.speculative import DraftConfig

CONTEXT_TOKENS = (1_024, 4_096, 16_384, 65_536, 131_072)


def filler_outputs(tokenizer, exclude_model: str = "gpt-4") -> list[np.ndarray]:
    """Token arrays of every MT-bench answer turn except ``exclude_model``'s."""
    records = mt_bench_all_models(exclude_model)
    return [np.asarray(t, dtype=np.int32)
            for t in tokenizer.encode_ordinary_batch([r.output for r in records])]


def _sweep_proposers(k: int, families: list[str]) -> list[ReplayProposer]:
    out: list[ReplayProposer] = []
    if "suffix_automaton" in families:
        out.append(SuffixAutomatonProposer("suffix_automaton", DraftConfig(max_draft_tokens=k)))
    if "ngram" in families:
        out.append(NgramProposer("ngram[5-5]", 5, 5))
    if "arctic" in families and arctic_available():
        out.append(ArcticProposer("arctic[global,factor=4]", 4.0))
    return out


def context_sweep(tokenizer, families: list[str], k: int = 32, steps: int = 200,
                  lengths: tuple[int, ...] = CONTEXT_TOKENS) -> list[dict]:
    """Rows ``{proposer, context_tokens, propose_p50_us, propose_p99_us, build_ms}``."""
    stream = np.concatenate(filler_outputs(tokenizer, exclude_model=""))
    rows = []
    for length in (256, *lengths):  # the first length only warms up (JIT, caches)
        if length + steps > stream.shape[0]:
            break
        for proposer in _sweep_proposers(k, families):
            rid = f"sweep-{length}"
            t0 = time.perf_counter_ns()
            proposer.start(rid, stream[:length].copy())
            build_ns = time.perf_counter_ns() - t0
            latencies = []
            for n in range(length, length + steps):
                t0 = time.perf_counter_ns()
                proposer.propose(rid, stream[:n], k)
                latencies.append(time.perf_counter_ns() - t0)
                proposer.update(rid, stream[n:n + 1])
            proposer.finish(rid)
            us = np.asarray(latencies, dtype=np.float64) / 1e3
            if length not in lengths:
                continue
            rows.append({"proposer": proposer.name, "context_tokens": length,
                         "propose_p50_us": round(percentile(us, 50), 2),
                         "propose_p99_us": round(percentile(us, 99), 2),
                         "build_ms": round(build_ns / 1e6, 2)})
    return rows


def prefill(proposer: ReplayProposer, outputs: list[np.ndarray]) -> None:
    """Feed ``outputs`` into ``proposer``'s shared cache as finished requests with no prompt."""
    empty = np.zeros(0, dtype=np.int32)
    for i, output in enumerate(outputs):
        rid = f"prefill-{i}"
        proposer.start(rid, empty)
        proposer.update(rid, output)
        proposer.finish(rid)


def large_cache_replay(tokenizer, requests: list[TokenizedRequest], families: list[str],
                       k: int) -> list[dict]:
    """`replay` rows after prefilling each shared cache with 1M+ tokens (plus ``cache_tokens``)."""
    outputs = filler_outputs(tokenizer)
    rows = []
    for proposer in _sweep_proposers(k, [f for f in families if f != "ngram"]):
        t0 = time.perf_counter()
        prefill(proposer, outputs)
        fill_s = time.perf_counter() - t0
        row = attrs.asdict(replay(proposer, requests, k))
        row["cache_tokens"] = int(sum(o.shape[0] + 1 for o in outputs))
        row["prefill_s"] = round(fill_s, 2)
        rows.append(row)
    return rows
