"""`Arrivals` without vLLM: admission gates, rank keys, deadline expiry and rejections."""

import math

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.rejection import Rejection
from integrations.vllm_v1.scheduling.arrivals import Arrivals
from integrations.vllm_v1.scheduling.faults import PolicyFaults
from policies import (
    CacheAwareRanker,
    EDFRanker,
    LoadSnapshot,
    QoSRanker,
    QueueDepthLimit,
    RequestView,
)
from tests.vllm_v1.scheduling.seam_fakes import FakeRequest, admit, view_of


class Loads:
    """The engine's load by a waiting count the test sets; remembers each ``now`` asked."""

    def __init__(self, waiting: int = 0) -> None:
        self.waiting = waiting
        self.asked: list[float] = []

    def __call__(self, now: float) -> LoadSnapshot:
        self.asked.append(now)
        return LoadSnapshot(now=now, waiting_requests=self.waiting, running_requests=0,
                            kv_usage=0.0, token_budget=2048)


class BrokenGate:
    def admit(self, request, load):
        raise RuntimeError("gate down")


class KeyRanker:
    """A ranking answering a fixed key (possibly not a number)."""

    def __init__(self, key) -> None:
        self.key = key

    def rank_key(self, request):
        return self.key

    def effective_priority(self, request, now):
        return 0.0


def arrivals(pipeline, loads=None):
    return Arrivals(pipeline=pipeline, load_snapshot=loads or Loads(),
                    faults=PolicyFaults(pipeline.policies))


VIEW = RequestView(request_id="r", arrival_s=1.0, prompt_tokens=10)


def test_the_first_refusing_gate_decides_with_the_load_at_now():
    loads = Loads(waiting=3)
    gate = arrivals(Pipeline(admission=QueueDepthLimit(max_waiting=3, retry_after_s=2.0)), loads)
    assert gate.verdict(VIEW, now=7.0) == Rejection(reason="queue_full", retry_after_s=2.0)
    assert loads.asked == [7.0]
    loads.waiting = 2
    assert gate.verdict(VIEW, now=8.0) is None


def test_without_gates_no_load_is_read():
    loads = Loads()
    assert arrivals(Pipeline(), loads).verdict(VIEW, now=1.0) is None
    assert loads.asked == []


def test_a_raising_gate_admits_and_is_counted():
    gate = arrivals(Pipeline(admission=BrokenGate()))
    assert gate.verdict(VIEW, now=1.0) is None
    assert gate.faults.counts == {("BrokenGate", "admission"): 1}


def test_the_rank_key_is_the_rankings_or_the_arrival_time_when_invalid():
    assert arrivals(Pipeline(ranking=KeyRanker(4))).rank_key(VIEW, 9.0, now=1.0) == 4
    for bad in (None, math.nan, "soon"):
        invalid = arrivals(Pipeline(ranking=KeyRanker(bad)))
        assert invalid.rank_key(VIEW, 9.0, now=1.0) == 9.0
        assert invalid.faults.counts == {("KeyRanker", "ranking"): 1}


def test_a_load_aware_ranking_reads_hits_and_the_load_on_arrival():
    loads = Loads()
    aware = arrivals(Pipeline(ranking=CacheAwareRanker(base=QoSRanker())), loads)
    assert aware.ranks_under_load and aware.reads_hits
    aware.rank_key(VIEW, 1.0, now=5.0)
    assert loads.asked == [5.0]
    assert not arrivals(Pipeline(ranking=QoSRanker())).reads_hits


def test_rejections_are_kept_until_taken_once():
    gate = arrivals(Pipeline())
    request = FakeRequest(request_id="r")
    gate.reject(request, Rejection(reason="queue_full"))
    assert [(e.request, e.rejection.reason) for e in gate.take_rejected()] == [
        (request, "queue_full")]
    assert gate.rejected == [] and gate.take_rejected() == []


def test_only_heads_past_their_deadline_expire():
    edf = arrivals(Pipeline(ranking=EDFRanker()))
    tracked = {}
    doomed = admit(tracked, FakeRequest(request_id="doomed"), rank_key=0.0, deadline_s=1.0)
    fine = admit(tracked, FakeRequest(request_id="fine"), rank_key=0.0, deadline_s=1e6)
    open_ended = admit(tracked, FakeRequest(request_id="open"), rank_key=0.0)
    assert edf.expired([doomed, fine, open_ended], view_of(tracked), now=50.0) == [doomed]
    assert arrivals(Pipeline()).expired([doomed], view_of(tracked), now=50.0) == []
