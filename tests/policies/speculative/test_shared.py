"""`SharedSuffixCache`: a token bound that always holds, and cursors that stay exact."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.speculative import SharedSuffixCache, SuffixAutomaton
from policies.speculative.shared import SEPARATOR, SharedCursors
from tests.helpers.oracles import oracle_match


class SharedCacheMachine(RuleBasedStateMachine):
    """Random outputs and requests against an oracle list of generations."""

    def __init__(self):
        super().__init__()
        self.cache = SharedSuffixCache(max_tokens=40, generations=2)
        self.model = [[]]  # oracle: token lists of the live generations, oldest first
        self.request = SuffixAutomaton()
        self.cursors = SharedCursors()
        self.stream = []

    @rule(output=st.lists(st.integers(0, 3), max_size=30))
    def add_output(self, output):
        self.cache.add(output)
        cap = self.cache.tokens_per_generation
        output = output[:cap - 1]
        if len(self.model[-1]) + len(output) + 1 > cap:
            self.model.append([])
            self.model = self.model[-2:]
        self.model[-1] += output + [SEPARATOR]

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=5))
    def request_emits(self, tokens):
        self.request.extend(tokens)
        self.stream += tokens
        self.cache.advance(self.cursors, np.asarray(tokens, np.int32), self.request, 10_000)
        for (automaton, cursor), text in zip(self.cache.live(self.cursors), self.model,
                                             strict=True):
            assert list(automaton.text) == text
            assert cursor[1] == oracle_match(text, self.stream)

    @invariant()
    def within_token_bound(self):
        stats = self.cache.stats()
        assert stats.tokens == sum(len(t) for t in self.model) <= self.cache.max_tokens
        self.cache.check_invariants()


TestSharedCache = SharedCacheMachine.TestCase
TestSharedCache.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_eviction_drops_whole_generations_and_counts_them():
    cache = SharedSuffixCache(max_tokens=100, generations=2)
    for _ in range(10):
        cache.add(list(range(20)))
    stats = cache.stats()
    assert stats.tokens <= 100 and stats.generations == 2
    assert stats.tokens_evicted == 10 * 21 - stats.tokens
    assert stats.epoch == 4  # 2 outputs of 21 tokens fit in a 50-token generation


def test_an_output_longer_than_a_generation_is_truncated():
    cache = SharedSuffixCache(max_tokens=20, generations=2)
    cache.add(list(range(30)))
    assert cache.stats().tokens == 10 and cache.stats().tokens_truncated == 21


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_tokens": 1}, "max_tokens must be >= 2"),
    ({"max_tokens": 10, "generations": 0}, "generations must be >= 1"),
    ({"max_tokens": 3, "generations": 2}, "max_tokens must be >= 2 \\* generations"),
])
def test_constructor_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SharedSuffixCache(**kwargs)
