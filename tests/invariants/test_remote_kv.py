"""Remote KV through a KV connector on every scheduler under test (stock vLLM as the control):
a request waiting for its remote blocks, aborted while they load, loads that fail (whole
request or some blocks, asynchronous or synchronous) under vLLM's ``recompute`` and ``fail``
policies. `ScriptedConnector` plays the remote cache, the test plays the worker.

Requests waiting for remote KV sit in ``kv_holding_waiting``, which `PolicyScheduler`
replaces with its own `PolicyRequestQueue`.
"""

import pytest

from integrations.vllm_v1.vllm_surface.names import FinishReason, RequestStatus
from tests.invariants.checks import assert_drained, blocks_of
from tests.invariants.connector import ASYNC_PREFIX, SYNC_PREFIX
from tests.invariants.driver import STOCK, Driver, prompt

REMOTE = ASYNC_PREFIX + "0"
SYNC = SYNC_PREFIX + "0"
PROMPT = 64
LOADED = 48
"""Tokens the connector offers for a 64-token prompt: every full block but the last token's."""


def _start_remote(case, is_async, policy="recompute"):
    driver = Driver.of(case, is_async=is_async, connector=policy)
    remote = driver.add(REMOTE, prompt(1, PROMPT), 5, tenant="t0")
    driver.add("local", prompt(2, 40), 5, tenant="t2")
    step = driver.step()
    assert REMOTE not in step.scheduler_output.num_scheduled_tokens
    assert remote.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert remote in list(driver.scheduler.kv_holding_waiting)
    assert len(blocks_of(driver.scheduler, REMOTE)) == LOADED // 16
    assert list(driver.connector.loading) == [REMOTE]
    return driver, remote


def _outputs_of(driver, request_id):
    return [o for o in driver.outputs if o.request_id == request_id]


def _finished_by(driver, request_id):
    ends = [o.finish_reason for o in _outputs_of(driver, request_id) if o.finish_reason]
    assert len(ends) == 1, f"{request_id} finished {len(ends)} times"
    return ends[0]


def _start_of(driver, request_id, limit=20):
    """Step until ``request_id`` is scheduled; its computed tokens before that step."""
    for _ in range(limit):
        step = driver.step()
        tokens = step.scheduler_output.num_scheduled_tokens.get(request_id)
        if tokens is not None:
            return driver.scheduler.requests[request_id].num_computed_tokens - tokens
    raise AssertionError(f"{request_id} not scheduled in {limit} steps")


def test_a_request_waits_for_its_remote_kv_then_runs_from_the_loaded_prefix(case, is_async):
    driver, remote = _start_remote(case, is_async)
    step = driver.step()  # the worker has not reported the load yet
    assert REMOTE not in step.scheduler_output.num_scheduled_tokens
    assert remote.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    driver.step(finished_recving={REMOTE})
    assert _start_of(driver, REMOTE) == LOADED
    driver.run()
    assert_drained(driver.scheduler)
    assert _finished_by(driver, REMOTE) == FinishReason.LENGTH
    assert _finished_by(driver, "local") == FinishReason.LENGTH


def test_aborting_a_request_while_its_kv_loads_frees_its_blocks_once_the_load_ends(
        case, is_async):
    driver, remote = _start_remote(case, is_async)
    driver.abort(REMOTE)
    assert remote.status == RequestStatus.FINISHED_ABORTED
    # the worker may still be writing into its blocks: vLLM keeps them until it reports
    assert REMOTE in driver.scheduler.requests and blocks_of(driver.scheduler, REMOTE)
    assert remote not in list(driver.scheduler.kv_holding_waiting)
    driver.step(finished_recving={REMOTE})
    assert REMOTE not in driver.scheduler.requests
    driver.run()
    assert_drained(driver.scheduler)
    assert driver.connector.finished.count(REMOTE) == 1
    assert not _outputs_of(driver, REMOTE)


def test_a_failed_remote_load_is_recomputed_from_scratch(case, is_async):
    driver, _ = _start_remote(case, is_async)
    driver.step(finished_recving={REMOTE}, failed_recving={REMOTE})
    assert _start_of(driver, REMOTE) == 0
    driver.run()
    assert_drained(driver.scheduler)
    assert _finished_by(driver, REMOTE) == FinishReason.LENGTH


def test_invalid_blocks_of_a_remote_load_truncate_it_to_the_valid_prefix(case, is_async):
    driver, _ = _start_remote(case, is_async)
    second = driver.connector.loading[REMOTE][1]
    driver.step(finished_recving={REMOTE}, invalid_block_ids={second})
    assert _start_of(driver, REMOTE) == 16
    driver.run()
    assert_drained(driver.scheduler)
    assert _finished_by(driver, REMOTE) == FinishReason.LENGTH


def test_under_the_fail_policy_a_failed_load_finishes_the_request_with_an_error(
        case, is_async):
    driver, _ = _start_remote(case, is_async, policy="fail")
    driver.step(finished_recving={REMOTE}, failed_recving={REMOTE})
    assert REMOTE not in driver.scheduler.requests
    assert _finished_by(driver, REMOTE) == FinishReason.ERROR
    driver.run()
    assert_drained(driver.scheduler)
    assert _finished_by(driver, "local") == FinishReason.LENGTH


ASYNC_PLACEHOLDER_LEAK = (
    "vLLM 0.32 AsyncScheduler (stock too): a request whose synchronous KV load fails in the "
    "step that completes its prefill keeps that step's output placeholder (update_from_output "
    "skips it), so the recompute schedules prompt + 1 tokens and the request stalls one token "
    "short of max_tokens, never finishing")
SYNC_MAX_TOKENS = 5


def _invalid_first_synchronous_block(case, is_async, policy):
    """A driver whose ``SYNC`` request's synchronously loaded first block was reported
    invalid in the step that loaded it (``local`` runs beside it)."""
    driver = Driver.of(case, is_async=is_async, connector=policy)
    driver.add(SYNC, prompt(1, PROMPT), SYNC_MAX_TOKENS, tenant="t0")
    driver.add("local", prompt(2, 40), 5, tenant="t2")

    def first_block(output):
        assert output.num_scheduled_tokens.get(SYNC) == PROMPT - LOADED  # loaded, not computed
        return {driver.connector.sync_loaded[SYNC][0]}

    driver.step(invalid_block_ids=first_block)
    return driver


@pytest.mark.parametrize(("is_async", "policy"), [(False, "recompute"), (False, "fail"),
                                                  (True, "fail")],
                         ids=["sync-recompute", "sync-fail", "async-fail"])
def test_invalid_blocks_of_a_synchronous_load_are_recomputed_or_fail(case, is_async, policy):
    driver = _invalid_first_synchronous_block(case, is_async, policy)
    if policy == "recompute":
        assert _start_of(driver, SYNC) == 0
    driver.run(limit=200)
    assert_drained(driver.scheduler)
    expected = FinishReason.LENGTH if policy == "recompute" else FinishReason.ERROR
    assert _finished_by(driver, SYNC) == expected
    assert _finished_by(driver, "local") == FinishReason.LENGTH


@pytest.mark.xfail(strict=True, reason=ASYNC_PLACEHOLDER_LEAK)
def test_stock_async_scheduler_recomputes_invalid_blocks_of_a_synchronous_load():
    driver = _invalid_first_synchronous_block((STOCK, "fcfs"), True, "recompute")
    assert _start_of(driver, SYNC) == 0
    driver.run(limit=200)
    assert _finished_by(driver, SYNC) == FinishReason.LENGTH


def test_under_the_async_placeholder_leak_every_scheduler_stalls_as_stock_does(case):
    """vLLM's leak (`ASYNC_PLACEHOLDER_LEAK`), which the xfail above tracks, reaches every
    asynchronous scheduler alike: ``SYNC`` is recomputed from scratch, then runs on one token
    short of its last with one placeholder left, and every other request finishes."""
    driver = _invalid_first_synchronous_block(case, True, "recompute")
    assert _start_of(driver, SYNC) == 0
    for _ in range(50):
        driver.step()
    stalled = driver.scheduler.requests[SYNC]
    assert sorted(driver.scheduler.requests) == [SYNC]
    assert _finished_by(driver, "local") == FinishReason.LENGTH
    assert (stalled.status, stalled.num_output_tokens, stalled.num_output_placeholders) == (
        RequestStatus.RUNNING, SYNC_MAX_TOKENS - 1, 1)


def test_a_request_reset_preempts_restarts_into_a_remote_load_in_the_next_step(case, is_async):
    """What the stateful machine found (stock vLLM does the same): ``reset_prefix_cache``
    preempts a running ``remote-`` request whose prefix was a local hit when it started (so
    the connector had nothing to offer); the next schedule restarts it at once, finds the
    cache empty, and the connector's offer sends it straight to ``WAITING_FOR_REMOTE_KVS``
    in the step whose ``preempted_req_ids`` names it, holding the blocks it loads into."""
    driver = Driver.of(case, is_async=is_async, connector="recompute")
    driver.add("warm", prompt(1, PROMPT, salt=1), 2, tenant="t0")
    driver.run()
    remote = driver.add(REMOTE, prompt(1, PROMPT, salt=2), 8, tenant="t0")
    step = driver.step()
    assert step.scheduler_output.num_scheduled_tokens[REMOTE] == PROMPT - LOADED  # local hit
    assert not driver.connector.loading
    assert driver.scheduler.reset_prefix_cache(reset_running_requests=True)
    assert remote.status == RequestStatus.PREEMPTED
    step = driver.step()  # the driver checks this step's preemption bookkeeping
    assert REMOTE in step.scheduler_output.preempted_req_ids
    assert REMOTE not in step.scheduler_output.num_scheduled_tokens
    assert remote.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert remote in list(driver.scheduler.kv_holding_waiting)
    assert len(blocks_of(driver.scheduler, REMOTE)) == LOADED // 16
    driver.run()
    assert_drained(driver.scheduler)
    assert _finished_by(driver, REMOTE) == FinishReason.LENGTH
