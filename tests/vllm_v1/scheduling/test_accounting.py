"""`Accounting` without vLLM: token caps, tenant quotas and the charges of a step."""

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.scheduling.accounting import Accounting, prefill_part
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from integrations.vllm_v1.vllm_surface.names import RequestStatus
from policies import WFQ, AdmissionDecision, Needs, TenantQuota
from tests.vllm_v1.scheduling.seam_fakes import FakeEngine, FakeRequest, admit, view_of

RUNNING, WAITING = RequestStatus.RUNNING, RequestStatus.WAITING


class FixedCap:
    """A rate policy capping every prefill chunk at ``cap``; records what it was told."""

    def __init__(self, cap) -> None:
        self.cap = cap
        self.scheduled: list[tuple[str, int]] = []

    def token_cap(self, request, load):
        if isinstance(self.cap, Exception):
            raise self.cap
        return self.cap

    def on_scheduled(self, request, tokens, now):
        self.scheduled.append((request.request_id, tokens))


class FixedQuota:
    """A KV-block quota of ``blocks`` for every request (admits everyone)."""

    needs = Needs(block_quota=True)

    def __init__(self, blocks) -> None:
        self.blocks = blocks

    def admit(self, request, load):
        return AdmissionDecision.accept()

    def level(self, kv_usage):
        return 0

    def block_quota(self, request, kv_usage):
        return self.blocks


def accounting(pipeline, engine=None):
    tracked = {}
    return Accounting(pipeline=pipeline, tracked=tracked, engine=engine or FakeEngine(),
                      view=view_of(tracked), faults=PolicyFaults(pipeline.policies))


@pytest.mark.parametrize(("tokens", "prompt", "computed", "part"), [
    (10, 100, 0, 10), (10, 100, 95, 5), (10, 100, 100, 0), (1, 100, 120, 0)])
def test_prefill_part_counts_only_prompt_tokens(tokens, prompt, computed, part):
    assert prefill_part(tokens, prompt, computed) == part


def test_the_rate_cap_keeps_a_waiting_request_at_one_token_and_may_skip_a_running_one():
    books = accounting(Pipeline(rate=FixedCap(0)))
    waiting = admit(books.tracked, FakeRequest(request_id="w", status=WAITING), rank_key=0)
    running = admit(books.tracked, FakeRequest(request_id="r", status=RUNNING), rank_key=0)
    assert books.token_cap(waiting, 0, 64) == 1
    assert books.token_cap(running, 0, 64) == 0
    assert books.waiting_grants == {"w": (0, 1)}  # only waiting requests' offers are kept


def test_decodes_are_never_capped_and_a_raising_cap_is_contained():
    books = accounting(Pipeline(rate=FixedCap(0)))
    decoding = admit(books.tracked, FakeRequest(request_id="d", status=RUNNING), rank_key=0)
    assert books.token_cap(decoding, 100, 1) == 1
    broken = accounting(Pipeline(rate=FixedCap(RuntimeError("cap down"))))
    request = admit(broken.tracked, FakeRequest(request_id="r", status=RUNNING), rank_key=0)
    assert broken.token_cap(request, 0, 64) == 64
    assert broken.faults.counts == {("FixedCap", "token_cap"): 1}


def test_the_kv_quota_spares_the_head_of_the_running_list():
    engine = FakeEngine(block_size=16, waiting_requests=1)
    books = accounting(Pipeline(watermarks=FixedQuota(2)), engine)
    head, other = (admit(books.tracked, FakeRequest(request_id=n, status=RUNNING), rank_key=0)
                   for n in ("head", "other"))
    engine.running = [head, other]
    assert books.token_cap(head, 0, 100) == 100
    assert books.token_cap(other, 20, 100) == 2 * 16 - 20
    engine.waiting_requests = 0  # no one to leave blocks for
    assert books.token_cap(other, 20, 100) == 100


def test_a_started_request_is_charged_once_at_dispatch_and_not_again_at_the_step_end():
    fairness = WFQ(weights={"a": 1, "b": 1})
    engine = FakeEngine()
    books = accounting(Pipeline(fairness=fairness), engine)
    started = admit(books.tracked, FakeRequest(request_id="s", num_prompt_tokens=100),
                    rank_key=0, tenant="a")
    decoding = admit(books.tracked, FakeRequest(request_id="d", num_prompt_tokens=10,
                                                num_computed_tokens=10, status=RUNNING),
                     rank_key=0, tenant="b")
    engine.requests = {"s": started, "d": decoding}
    for tenant in ("a", "b"):
        fairness.on_backlogged(tenant)
    books.begin_step()
    books.token_cap(started, 0, 40)
    started.status = RUNNING  # vLLM started it
    books.charge_dispatched("a", started)
    after_dispatch = fairness.counter("a")
    assert after_dispatch > 0 and books.charged_on_dispatch == {"s"}
    books.account_service({"s": 40, "d": 1}, {}, now=0.0)
    assert fairness.counter("a") == after_dispatch
    assert fairness.stats().output_tokens["b"] == 1
    assert books.charged_on_dispatch == set()


def test_a_request_popped_only_to_be_skipped_costs_nothing():
    fairness = WFQ()
    books = accounting(Pipeline(fairness=fairness))
    skipped = admit(books.tracked, FakeRequest(request_id="s"), rank_key=0, tenant="a")
    books.token_cap(skipped, 0, 40)
    books.charge_dispatched("a", skipped)  # still waiting: vLLM skipped it
    assert books.charged_on_dispatch == set() and fairness.counter("a") == 0


def test_quotas_count_running_requests_and_their_blocks_per_tenant():
    engine = FakeEngine(max_num_running_reqs=2, block_size=16)
    books = accounting(Pipeline(fairness=WFQ(), quotas=TenantQuota()), engine)
    hog = admit(books.tracked, FakeRequest(request_id="h", num_computed_tokens=17,
                                           status=RUNNING), rank_key=0, tenant="hog")
    engine.running = [hog]
    assert books.tenants_under_quota(["hog", "quiet"]) == ["quiet"]
    assert books.quota_usage == ({"hog": 1}, {"hog": 2})  # 17 tokens: two blocks
    books.end_picks()
    assert books.quota_usage is None


def test_the_rate_policy_is_told_of_prefill_chunks_only():
    rate = FixedCap(None)
    engine = FakeEngine()
    books = accounting(Pipeline(rate=rate), engine)
    prefill = admit(books.tracked, FakeRequest(request_id="p", num_prompt_tokens=100,
                                               num_computed_tokens=50), rank_key=0)
    decode = admit(books.tracked, FakeRequest(request_id="d", num_prompt_tokens=10,
                                              num_computed_tokens=12), rank_key=0)
    engine.requests = {"p": prefill, "d": decode}
    books.account_service({"p": 30, "d": 1}, {}, now=0.0)
    assert rate.scheduled == [("p", 30)]
