"""The replay loop: draft, verify against the real output, emit accepted + 1, update, repeat.

For each request (arrival order): the proposer sees the prompt, then each step it drafts up to
``k`` tokens from the context so far; the longest prefix of the draft that equals the real
output is accepted and the next real token is emitted as the bonus token (none past the end of
the output). The cross-request caches only ever see outputs of earlier requests (or, for
arctic, the current request's output as it is generated, as in vLLM).
"""

from __future__ import annotations

import gc
import time

import attrs
import numpy as np

from benchmarks.spec_replay.proposers import ReplayProposer
from policies.percentile import percentile
from policies.speculative import SpecMetrics

_clock_ns = time.perf_counter_ns


@attrs.frozen(kw_only=True)
class TokenizedRequest:
    """A request's prompt and real output as ``int32`` token arrays."""

    id: str
    prompt: np.ndarray
    output: np.ndarray


@attrs.frozen(kw_only=True)
class ReplayResult:
    """One row of ``summary.json`` (see BENCHMARKS.md §3 for each metric's definition)."""

    proposer: str
    k: int
    tau: float
    tau_d: float
    acceptance: float
    coverage: float
    propose_p50_us: float
    propose_p99_us: float
    update_us_per_token: float
    bytes_per_token: float
    requests: int
    output_tokens: int


def tokenize(records, tokenizer) -> list[TokenizedRequest]:
    """Encode prompts and outputs (special-token text is treated as plain text)."""
    prompts = tokenizer.encode_ordinary_batch([r.prompt for r in records])
    outputs = tokenizer.encode_ordinary_batch([r.output for r in records])
    return [TokenizedRequest(id=r.id, prompt=np.asarray(p, dtype=np.int32),
                             output=np.asarray(o, dtype=np.int32))
            for r, p, o in zip(records, prompts, outputs, strict=True)]


def accepted_prefix(draft: list[int], truth: np.ndarray) -> int:
    """Length of the longest prefix of ``draft`` equal to the start of ``truth``."""
    n = min(len(draft), truth.shape[0])
    for i in range(n):
        if draft[i] != truth[i]:
            return i
    return n


def replay(proposer: ReplayProposer, requests: list[TokenizedRequest], k: int) -> ReplayResult:
    """Replay ``requests`` in order through ``proposer`` with draft cap ``k``."""
    metrics = SpecMetrics()
    propose_ns: list[int] = []
    update_ns = 0
    gc.collect()
    gc.disable()
    try:
        for req in requests:
            context = np.empty(req.prompt.shape[0] + req.output.shape[0], dtype=np.int32)
            n = req.prompt.shape[0]
            context[:n] = req.prompt
            proposer.start(req.id, req.prompt)
            pos = 0
            while pos < req.output.shape[0]:
                t0 = _clock_ns()
                draft = proposer.propose(req.id, context[:n], k)
                propose_ns.append(_clock_ns() - t0)
                accepted = accepted_prefix(draft, req.output[pos:])
                emit = min(accepted + 1, req.output.shape[0] - pos)
                new = req.output[pos:pos + emit]
                context[n:n + emit] = new
                n += emit
                pos += emit
                t0 = _clock_ns()
                proposer.update(req.id, new)
                update_ns += _clock_ns() - t0
                metrics.record(len(draft), accepted, emit)
            t0 = _clock_ns()
            proposer.finish(req.id)
            update_ns += _clock_ns() - t0
    finally:
        gc.enable()
    stats = metrics.stats()
    latency_us = np.asarray(propose_ns, dtype=np.float64) / 1e3
    return ReplayResult(
        proposer=proposer.name, k=k, tau=round(stats.tau, 4), tau_d=round(stats.tau_d, 4),
        acceptance=round(stats.acceptance_rate, 4), coverage=round(stats.coverage, 4),
        propose_p50_us=round(percentile(latency_us, 50), 2) if propose_ns else 0.0,
        propose_p99_us=round(percentile(latency_us, 99), 2) if propose_ns else 0.0,
        update_us_per_token=round(update_ns / 1e3 / max(stats.emitted_tokens, 1), 3),
        bytes_per_token=round(proposer.bytes_per_token(), 1), requests=len(requests),
        output_tokens=stats.emitted_tokens)
