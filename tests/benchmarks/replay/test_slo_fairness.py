"""Fairness between the tenants of one SLO class, through vLLM's real scheduler in virtual
time: a tenant sending three times its share does not take a quiet tenant's share."""

import random

import pytest

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.driver import replay
from benchmarks.replay.trace import Trace, TraceRequest
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.instruments import EngineShape, SchedulerHarness

SHAPE = EngineShape(num_blocks=16384, max_num_batched_tokens=8192, max_num_seqs=128)
COST = StepCostModel.preset("h100")
TTFT_S = 1.0
CLASSES = {"chat": {"ttft_s": TTFT_S, "tpot_s": 0.25}}
"""A TPOT target loose enough that the first-token deadline is what admission runs out of
(fairness shares the prefill rate; the TPOT bound is the whole batch's)."""
CAPACITY_PER_S = 18.0
"""Requests of 2,000 prompt tokens the ``slo`` preset serves on time per second here (one
tenant offered 40/s: 18.7/s)."""
DURATION_S, WARM_UP_S = 30.0, 5.0


def two_tenants(seed: int = 1) -> Trace:
    """``quiet`` sends its equal share of the class, ``noisy`` three times its share: twice
    the engine's capacity in all, Poisson arrivals."""
    rng, arrivals = random.Random(seed), []
    for tenant, rate in (("quiet", CAPACITY_PER_S / 2), ("noisy", 3 * CAPACITY_PER_S / 2)):
        now = rng.expovariate(rate)
        while now < DURATION_S:
            arrivals.append((now, tenant))
            now += rng.expovariate(rate)
    return Trace(name="noisy-neighbour", requests=tuple(
        TraceRequest(request_id=f"{tenant}{i}", arrival_s=arrival, prompt_tokens=2000,
                     output_tokens=20, tenant=tenant, slo_class="chat")
        for i, (arrival, tenant) in enumerate(sorted(arrivals))))


def serve(declaration: dict) -> tuple[dict[str, tuple[int, int]], SchedulerHarness]:
    """Each tenant's ``(admitted, on time)`` after the warm-up, and the harness."""
    harness = SchedulerHarness.build(slo_pipeline(SLOSpec.parse(declaration)), shape=SHAPE)
    run = replay(two_tenants(), "slo", shape=SHAPE, cost_model=COST, harness=harness)
    counts = {}
    for tenant in ("quiet", "noisy"):
        admitted = [r for r in run.records if r.tenant == tenant
                    and r.arrival_s >= WARM_UP_S and r.outcome == "completed"]
        on_time = [r for r in admitted if r.token_times_s[0] - r.arrival_s <= TTFT_S]
        counts[tenant] = len(admitted), len(on_time)
    return counts, harness


@pytest.mark.slow
def test_a_quiet_tenant_keeps_its_share_of_its_class_beside_a_noisy_one():
    fair, harness = serve({"classes": CLASSES, "fairness": {"weights": {"quiet": 1}}})
    admitted, on_time = fair["quiet"]
    assert on_time >= 0.95 * admitted
    goodput = on_time + fair["noisy"][1]
    assert on_time >= 0.9 * goodput / 2, fair  # equal weights: half the class's goodput
    admission = harness.scheduler.pipeline.admission  # the engine's own copy
    admission.check_invariants()
    admission.fairness.check_invariants()
    stats = admission.fairness.stats()
    assert stats.over_share_admissions["noisy"] > stats.over_share_admissions.get("quiet", 0)
    assert stats.in_flight == 0

    # the same load first come, first served: noisy takes most of the class
    unfair, _ = serve({"classes": CLASSES})
    assert unfair["quiet"][1] < 0.75 * (unfair["quiet"][1] + unfair["noisy"][1]) / 2, unfair
