"""`InteractivePrefillGuard`: long chunks shrink only while a short prompt has prefill left."""

import pytest

from policies import LoadSnapshot, RequestView
from policies.rate.prefill_guard import InteractivePrefillGuard

LOAD = LoadSnapshot(now=0.0, waiting_requests=1, running_requests=1, kv_usage=0.2,
                    token_budget=8192)


def view(request_id, prompt_tokens, computed_tokens=0):
    return RequestView(request_id=request_id, arrival_s=0.0, prompt_tokens=prompt_tokens,
                       computed_tokens=computed_tokens)


def test_long_prefill_is_capped_only_while_a_short_one_is_outstanding():
    guard = InteractivePrefillGuard(long_prompt_tokens=4096, contended_chunk_tokens=1024)
    rag, chat = view("rag", 30000), view("chat", 300)
    guard.on_admitted(rag, 0.0)
    assert guard.token_cap(rag, LOAD) is None, "alone: the whole budget"
    guard.on_admitted(chat, 0.0)
    assert guard.token_cap(rag, LOAD) == 1024
    assert guard.token_cap(chat, LOAD) is None, "short prompts are never capped"
    guard.on_scheduled(chat, 200, 0.0)
    assert guard.token_cap(rag, LOAD) == 1024, "100 prompt tokens still to go"
    guard.on_scheduled(view("chat", 300, computed_tokens=200), 100, 0.0)
    assert guard.token_cap(rag, LOAD) is None
    assert guard.stats().capped_chunks == 2


def test_a_finished_or_cached_short_request_releases_the_cap():
    guard = InteractivePrefillGuard()
    guard.on_admitted(view("cached", 300, computed_tokens=300), 0.0)
    assert guard.stats().short_prefills_outstanding == 0
    guard.on_admitted(view("aborted", 300), 0.0)
    guard.on_finished(view("aborted", 300), 0.0)
    assert guard.token_cap(view("rag", 9000), LOAD) is None


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="contended_chunk_tokens must be >= 1"):
        InteractivePrefillGuard(contended_chunk_tokens=0)
