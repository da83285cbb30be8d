"""A stateful search over request lifecycles: hypothesis interleaves arrivals (shared
prefixes, tenants, priorities, deadlines, remote and synchronous KV loads), steps, remote
loads completing or failing, aborts (queued, running, in flight, loading), bursts that
force preemption and ``reset_prefix_cache``, on a scheduler drawn from every preset and
stock vLLM, synchronous or asynchronous, with or without a KV connector.

After every rule the scheduler is consistent (`assert_consistent`; `Driver` also checks
each step's preemptions); at the end it drains with nothing left (`assert_drained`) and
every request not aborted by its client finished exactly once, by length, by rejection
(``abort`` with the `Rejection`'s ``stop_reason``) or, under vLLM's ``fail`` policy, by
error after a failed KV load.
"""

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from integrations.vllm_v1.vllm_surface.names import FinishReason
from tests.invariants.checks import assert_consistent, assert_drained
from tests.invariants.connector import ASYNC_PREFIX, SYNC_PREFIX
from tests.invariants.driver import CASES, TENANTS, Driver, prompt, small_shape

BLOCK_SIZE = 16


class SchedulerMachine(RuleBasedStateMachine):
    """Random request lifecycles against one scheduler; invariants after every rule."""

    @initialize(case=st.sampled_from(CASES), is_async=st.booleans(),
                connector=st.sampled_from([None, "recompute", "fail"]),
                num_blocks=st.sampled_from([9, 17, 33]))
    def build(self, case, is_async, connector, num_blocks):
        # vLLM refuses to start unless one max_model_len request fits the KV cache (and its
        # frontend refuses prompt + max_tokens over max_model_len): without that, a request
        # larger than the pool never finishes, on stock vLLM as on ours
        self.max_model_len = (num_blocks - 1) * BLOCK_SIZE
        self.driver = Driver.of(case, is_async=is_async, connector=connector,
                                shape=small_shape(num_blocks=num_blocks, max_num_seqs=4,
                                                  max_num_batched_tokens=64,
                                                  block_size=BLOCK_SIZE,
                                                  max_model_len=self.max_model_len))
        self.is_async, self.has_connector = is_async, connector is not None
        # vLLM's own AsyncScheduler stalls on a failed synchronous load under `recompute`
        # (see test_remote_kv.ASYNC_PLACEHOLDER_LEAK): only the sync scheduler gets those
        self.sync_failures = connector == "fail" or (connector and not is_async)
        self.added: dict[str, int] = {}
        self.aborted: set[str] = set()

    # -- arrivals -----------------------------------------------------------------

    def _add(self, kind, group, length, max_tokens, tenant, priority, deadline_ms):
        prefix = {"remote": ASYNC_PREFIX, "sync": SYNC_PREFIX}.get(kind, "r") \
            if self.has_connector else "r"
        request_id = f"{prefix}{len(self.added)}"
        max_tokens = min(max_tokens, self.max_model_len - length)
        self.added[request_id] = max_tokens
        self.driver.add(request_id, prompt(group, length, salt=len(self.added)), max_tokens,
                        tenant=tenant, priority=priority, deadline_ms=deadline_ms)

    @rule(kind=st.sampled_from(["local", "local", "remote", "sync"]),
          group=st.integers(0, 3), length=st.integers(1, 120), max_tokens=st.integers(1, 16),
          tenant=st.sampled_from(TENANTS), priority=st.integers(-1, 1),
          deadline_ms=st.sampled_from([None, None, 40.0, 400.0]))
    def add(self, kind, group, length, max_tokens, tenant, priority, deadline_ms):
        self._add(kind, group, length, max_tokens, tenant, priority, deadline_ms)

    @rule(count=st.integers(2, 5), group=st.integers(0, 3))
    def burst(self, count, group):
        """Long prompts of one prefix at once: KV pressure, preemptions."""
        for _ in range(count):
            self._add("local", group, 100, 16, TENANTS[0], 0, None)

    # -- steps ----------------------------------------------------------------------

    @rule()
    def step(self):
        self.driver.step()

    @precondition(lambda self: self.has_connector)
    @rule(data=st.data())
    def finish_loads(self, data):
        """The worker reports the loads in flight, some of them failed."""
        loading = sorted(self.driver.connector.loading)
        failed = data.draw(st.sets(st.sampled_from(loading))) if loading else set()
        self.driver.step(finished_recving=loading, failed_recving=failed)

    @precondition(lambda self: self.sync_failures)
    @rule()
    def fail_sync_loads(self):
        """A step whose synchronous loads fail (their first block is invalid)."""
        connector = self.driver.connector

        def invalid(output):
            started = {new.req_id for new in output.scheduled_new_reqs}
            return {connector.sync_loaded.pop(r)[0] for r in list(connector.sync_loaded)
                    if r in started}

        self.driver.step(invalid_block_ids=invalid)

    # -- aborts ---------------------------------------------------------------------

    def _live(self):
        return sorted(r for r, request in self.driver.scheduler.requests.items()
                      if not request.is_finished())

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(self._live()))
        self.aborted.add(request_id)
        self.driver.abort(request_id)

    @rule(data=st.data())
    def abort_in_flight(self, data):
        def victims(output):
            scheduled = sorted(output.num_scheduled_tokens)
            chosen = data.draw(st.sets(st.sampled_from(scheduled), max_size=2)) \
                if scheduled else set()
            self.aborted.update(chosen)
            return chosen

        self.driver.step(abort_in_flight=victims)

    @precondition(lambda self: not self.driver.scheduler.kv_holding_waiting
                  and not (self.has_connector and self.driver.connector.loading))
    @rule()
    def reset_prefix_cache(self):
        assert self.driver.scheduler.reset_prefix_cache(reset_running_requests=True)
        assert not self.driver.scheduler.running

    @invariant()
    def consistent(self):
        if hasattr(self, "driver"):
            assert_consistent(self.driver.scheduler)

    def teardown(self):
        if not hasattr(self, "driver"):
            return
        driver = self.driver
        driver.run(limit=2000)
        assert_drained(driver.scheduler)
        ends = Counter(o.request_id for o in driver.outputs if o.finish_reason is not None)
        assert all(n == 1 for n in ends.values()), [r for r, n in ends.items() if n > 1]
        lost = [r for r in self.added if r not in self.aborted and not ends[r]]
        assert not lost, f"requests that never finished: {lost}"
        tokens = Counter()
        for output in driver.outputs:
            tokens[output.request_id] += len(output.new_token_ids)
            reason = output.finish_reason
            if reason == FinishReason.LENGTH:
                assert tokens[output.request_id] == self.added[output.request_id]
            elif reason == FinishReason.ABORT:
                assert output.request_id in self.aborted or output.stop_reason, output
            elif reason == FinishReason.ERROR:
                assert driver.scheduler.connector is not None, output
            else:
                assert reason is None, output


SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestSchedulerLifecycles = SchedulerMachine.TestCase
