"""`SuffixAutomatonProposer` against vLLM's ``custom_class`` contract, without an engine.

The engine passes, each step, the rows' newly sampled tokens, their lengths and the token
matrix; rows move when the batch is condensed, and a request that leaves the batch is gone.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from integrations.vllm_v1.speculative.metrics import SpecPrometheus
from integrations.vllm_v1.speculative.proposer import SuffixAutomatonProposer
from integrations.vllm_v1.speculative.rows import BatchRows

K, MAX_LEN = 6, 64
LOOP = list(range(100, 110))


def make_proposer():
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                             model_config=SimpleNamespace(max_model_len=MAX_LEN))
    return SuffixAutomatonProposer(config)


class Batch:
    """A fake input batch: contexts by row, with the tokens sampled this step."""

    def __init__(self):
        self.contexts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def step(self, proposer):
        tokens = np.zeros((max(len(self.contexts), 1), MAX_LEN), dtype=np.int32)
        for i, ctx in enumerate(self.contexts):
            tokens[i, :len(ctx)] = ctx
        lengths = np.array([len(c) for c in self.contexts], dtype=np.int32)
        drafts = proposer.propose(self.sampled, lengths, tokens)
        assert len(drafts) == len(self.contexts)
        for ctx, draft in zip(self.contexts, drafts, strict=True):
            assert len(draft) <= max(0, min(K, MAX_LEN - len(ctx) - 1))
        return drafts


def test_drafts_only_for_rows_that_sampled_and_within_limits():
    proposer, batch = make_proposer(), Batch()
    batch.contexts = [LOOP + LOOP[:3], LOOP + LOOP[:3], list(range(MAX_LEN))]
    batch.sampled = [[LOOP[2]], [], [7]]
    drafts = batch.step(proposer)
    assert drafts[0] == LOOP[3:3 + K]
    assert drafts[1] == [] and drafts[2] == []  # prefill chunk; at max_model_len


def test_requests_are_followed_across_rows_and_acceptance_is_recorded():
    proposer, batch = make_proposer(), Batch()
    a, b = LOOP + LOOP[:3], [1, 2, 3, 1, 2]
    batch.contexts, batch.sampled = [a, b], [[a[-1]], [b[-1]]]
    first = batch.step(proposer)
    assert first[0] == LOOP[3:3 + K]
    # Next step: the engine accepted 2 of a's draft (+1 bonus) and condensed b into row 0.
    a = a + first[0][:2] + [999]
    b = b + [3]
    batch.contexts, batch.sampled = [b, a], [[3], first[0][:2] + [999]]
    batch.step(proposer)
    stats = proposer.stats()
    assert stats.drafter.active_requests == 2, "no request restarted"
    assert stats.verification.accepted_tokens == 2
    assert stats.verification.steps == 2
    assert stats.tracked_requests == 2


def test_a_request_that_leaves_the_batch_feeds_the_shared_cache():
    proposer, batch = make_proposer(), Batch()
    context = [7, 7, 8]
    for token in LOOP:  # one token per step, drafts rejected
        context = context + [token]
        batch.contexts, batch.sampled = [context], [[token]]
        batch.step(proposer)
    batch.contexts, batch.sampled = [[50, 51]], [[51]]
    for _ in range(BatchRows().grace_steps + 1):
        batch.step(proposer)
        batch.contexts = [batch.contexts[0] + [52]]
        batch.sampled = [[52]]
    shared = proposer.stats().drafter.shared
    assert shared.outputs_added == 1
    assert shared.tokens == len(LOOP) + 1, "the output (not the prompt) plus a separator"
    batch.contexts, batch.sampled = [[60, 61] + LOOP[:4]], [[LOOP[3]]]
    assert batch.step(proposer)[0] == LOOP[4:4 + K]


def test_prometheus_export_advances_counters_by_exact_deltas():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    exporter = SpecPrometheus.create(registry)
    proposer, batch = make_proposer(), Batch()
    batch.contexts, batch.sampled = [LOOP + LOOP[:3]], [[LOOP[2]]]
    draft = batch.step(proposer)[0]
    batch.contexts = [batch.contexts[0] + draft + [5]]
    batch.sampled = [draft + [5]]
    batch.step(proposer)
    exporter.publish(proposer.stats())
    exporter.publish(proposer.stats())
    assert registry.get_sample_value("policies:spec_accepted_tokens_total") == len(draft)
    assert registry.get_sample_value("policies:spec_steps_total") == 1
    assert registry.get_sample_value("policies:spec_shared_cache_tokens") == 0
    assert registry.get_sample_value("policies:spec_tau") == len(draft) + 1


def test_load_model_warms_kernels_without_touching_state():
    proposer = make_proposer()
    proposer.load_model()
    stats = proposer.stats()
    assert stats.drafter.proposals == 0
    assert stats.tracked_requests == 0
    assert stats.verification.steps == 0
    assert stats.drafter.shared.tokens == 0
