"""Request lifecycles on every scheduler under test, stock vLLM included as the control:
no block leaks once every request has finished, aborts in every state, preemption
bookkeeping, prefix-cache stats counted once per lookup, ``reset_prefix_cache``.

`Driver` asserts `assert_consistent` (queues, statuses, every block's reference count,
tracked requests, policy invariants, no contained policy fault) after every step and the
preemption bookkeeping of every step; each test ends with `assert_drained`.
"""

from integrations.vllm_v1.vllm_surface.names import FinishReason, RequestStatus
from tests.invariants.checks import assert_drained, blocks_of, free_blocks, usable_blocks
from tests.invariants.driver import TENANTS, Driver, prompt, small_shape

GATES_STARTS = {"pd-decode"}
"""Presets that start a request only when its KV fits (`DecodeKVGate`): no preemption."""


def _finished_in_full(driver: Driver, requests: dict[str, int]) -> None:
    """Each of ``requests`` (id -> max tokens) finished once, by length, with all its tokens."""
    ends = [o for o in driver.outputs if o.finish_reason is not None]
    by_id = {}
    for output in ends:
        assert output.request_id not in by_id, f"{output.request_id} finished twice"
        by_id[output.request_id] = output
    assert set(by_id) == set(requests), set(by_id) ^ set(requests)
    assert all(o.finish_reason == FinishReason.LENGTH for o in by_id.values())
    tokens = dict.fromkeys(requests, 0)
    for output in driver.outputs:
        if output.request_id in tokens:
            tokens[output.request_id] += len(output.new_token_ids)
    assert tokens == requests


def test_a_mixed_load_under_kv_pressure_drains_without_leaks(case, is_async):
    # 14 requests of 3 tenants sharing prefixes, 16 usable blocks: chunked prefills,
    # prefix-cache hits and preemptions; every step checked, then nothing may be left
    driver = Driver.of(case, is_async=is_async, shape=small_shape(num_blocks=17))
    wanted = {}
    for i in range(14):
        wanted[f"r{i}"] = 20 + 7 * (i % 4)
        driver.add(f"r{i}", prompt(i % 3, 20 + 11 * i, salt=i + 1), wanted[f"r{i}"],
                   tenant=TENANTS[i % 3], priority=i % 3 - 1)
    driver.run()
    assert_drained(driver.scheduler)
    _finished_in_full(driver, wanted)
    assert driver.preemptions > 0 or case[0] in GATES_STARTS
    # prefix-cache stats: every start and restart counted once, with the hit it had
    assert driver.expected.hits > 0 and driver.expected.preempted_requests == driver.preemptions
    assert driver.reported == driver.expected


def test_aborting_a_waiting_request_frees_it_everywhere(case, is_async):
    driver = Driver.of(case, is_async=is_async, shape=small_shape(max_num_seqs=2))
    for i in range(5):
        driver.add(f"r{i}", prompt(i, 24), 6, tenant=TENANTS[i % 3])
    driver.step()
    victim = next(r for r in driver.scheduler.waiting if r.status == RequestStatus.WAITING)
    free = free_blocks(driver.scheduler)
    driver.abort(victim.request_id)
    assert victim.status == RequestStatus.FINISHED_ABORTED
    assert victim.request_id not in driver.scheduler.requests
    assert victim not in list(driver.scheduler.waiting)
    assert free_blocks(driver.scheduler) == free
    driver.run()
    assert_drained(driver.scheduler)
    _finished_in_full(driver, {f"r{i}": 6 for i in range(5) if f"r{i}" != victim.request_id})


def test_aborting_running_requests_mid_prefill_and_mid_decode_frees_their_blocks(case, is_async):
    driver = Driver.of(case, is_async=is_async, shape=small_shape(num_blocks=64))
    driver.add("short", prompt(2, 20), 30, tenant="t2")
    driver.add("long", prompt(1, 450), 4, tenant="t0")  # chunked: 128 tokens a step at most
    driver.add("other", prompt(3, 20), 8, tenant="t5")
    states = {"long": lambda r: 0 < r.num_computed_tokens < 450,  # mid-prefill
              "short": lambda r: r.num_output_tokens > 0}  # mid-decode
    for _ in range(20):
        driver.step()
        for request_id, state in list(states.items()):
            request = driver.scheduler.requests[request_id]
            if request.status != RequestStatus.RUNNING or not state(request):
                continue
            held = blocks_of(driver.scheduler, request_id)
            exclusive = sum(1 for b in held if b.ref_cnt == 1)
            free = free_blocks(driver.scheduler)
            driver.abort(request_id)
            assert request_id not in driver.scheduler.requests
            assert free_blocks(driver.scheduler) == free + exclusive
            del states[request_id]
    assert not states, f"never caught running: {sorted(states)}"
    driver.run()
    assert_drained(driver.scheduler)
    _finished_in_full(driver, {"other": 8})


def test_aborting_a_request_while_its_step_runs_drops_its_output(case, is_async):
    driver = Driver.of(case, is_async=is_async)
    driver.add("a", prompt(1, 40), 6, tenant="t0")
    driver.add("b", prompt(2, 40), 6, tenant="t2")
    driver.step()
    step = driver.step(abort_in_flight=lambda output: [r for r in output.num_scheduled_tokens
                                                       if r == "a"])
    assert "a" in step.scheduler_output.num_scheduled_tokens
    assert not [o for o in step.outputs if o.request_id == "a"]
    driver.run()
    assert_drained(driver.scheduler)
    assert "a" not in driver.finished


def test_aborting_a_preempted_request_frees_it(case, is_async):
    # 4 usable blocks, two requests growing past two blocks each: one is preempted
    driver = Driver.of(case, is_async=is_async, shape=small_shape(num_blocks=5))
    driver.add("a", prompt(1, 20), 40, tenant="t0")
    driver.add("b", prompt(2, 20), 40, tenant="t2")
    for _ in range(60):
        driver.step()
        preempted = [r for r in driver.scheduler.waiting if r.status == RequestStatus.PREEMPTED]
        if preempted:
            break
    else:
        assert case[0] in GATES_STARTS, "no preemption in 60 steps"
        return
    victim = preempted[0]
    driver.abort(victim.request_id)
    assert victim.request_id not in driver.scheduler.requests
    driver.run()
    assert_drained(driver.scheduler)
    _finished_in_full(driver, {r: 40 for r in ("a", "b") if r != victim.request_id})


def test_reset_prefix_cache_preempts_every_running_request_and_frees_every_block(
        case, is_async):
    driver = Driver.of(case, is_async=is_async)
    for i in range(4):
        driver.add(f"r{i}", prompt(1, 40, salt=i + 1), 10, tenant=TENANTS[i % 3])
    driver.step()
    driver.step()
    running = list(driver.scheduler.running)
    assert running
    assert driver.scheduler.reset_prefix_cache(reset_running_requests=True)
    assert not driver.scheduler.running
    assert free_blocks(driver.scheduler) == usable_blocks(driver.scheduler)
    for request in running:
        assert request.status == RequestStatus.PREEMPTED and request.num_computed_tokens == 0
    if driver.fcfs_queue:  # vLLM's order: resumed first-in first-out
        assert list(driver.scheduler.waiting)[:len(running)] == running
    driver.run()
    assert_drained(driver.scheduler)
    _finished_in_full(driver, {f"r{i}": 10 for i in range(4)})
