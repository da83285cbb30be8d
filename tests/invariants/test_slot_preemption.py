"""Slot preemption (the ``slo`` preset) under the invariant driver: with every slot taken,
more urgent arrivals preempt running requests, every step stays consistent, each victim is
preempted for a slot at most once, and every request finishes with all its tokens."""

from integrations.vllm_v1.vllm_surface.names import FinishReason
from tests.invariants.checks import assert_drained
from tests.invariants.driver import TENANTS, Driver, prompt, small_shape


def test_more_urgent_arrivals_take_full_slots_and_every_request_finishes(is_async):
    driver = Driver.of(("slo", "fcfs"), is_async=is_async, shape=small_shape(max_num_seqs=2))
    wanted = {}
    for i in range(8):  # a wave of relaxed requests, then ever more urgent ones
        wanted[f"r{i}"] = 6 + 3 * i
        driver.add(f"r{i}", prompt(i, 24 + 5 * i), wanted[f"r{i}"], tenant=TENANTS[i % 3],
                   priority=2 - i)
        driver.step()
    driver.run()
    assert_drained(driver.scheduler)
    stats = driver.scheduler.pipeline.preemption.stats()
    # each request at most once (``max_per_request``), every one in the step's output
    assert 3 <= stats.preemptions <= len(wanted) and driver.preemptions >= stats.preemptions
    ends = {o.request_id: o for o in driver.outputs if o.finish_reason is not None}
    assert set(ends) == set(wanted)
    assert all(o.finish_reason == FinishReason.LENGTH for o in ends.values())
    tokens = dict.fromkeys(wanted, 0)
    for output in driver.outputs:
        tokens[output.request_id] += len(output.new_token_ids)
    assert tokens == wanted


def test_the_request_a_slot_was_freed_for_starts_in_that_step(is_async):
    driver = Driver.of(("slo", "fcfs"), is_async=is_async, shape=small_shape(max_num_seqs=1))
    driver.add("relaxed", prompt(0, 40), 30, priority=1)
    driver.step()
    driver.add("later", prompt(1, 20), 4, priority=1)
    driver.add("urgent", prompt(2, 20), 4, priority=-1)
    step = driver.step()
    assert step.scheduler_output.preempted_req_ids == {"relaxed"}
    assert set(step.scheduler_output.num_scheduled_tokens) == {"urgent"}
    driver.run()
    assert driver.finished.index("urgent") < driver.finished.index("relaxed") < \
        driver.finished.index("later")
    assert_drained(driver.scheduler)
