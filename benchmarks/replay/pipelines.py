"""Pipelines the replay names by import path (``pipeline:benchmarks.replay.pipelines:NAME``).

- `decode_protected`: the ``default`` preset with `StepPrefillBudget` in its ``rate`` slot
  (beside the token bucket): one step's prefill chunks stay within 1,024 tokens while a
  request decodes (no prompt exempt).
- `slo_protected`: `decode_protected` with `SLOAdmission` in the ``admission`` slot: a
  request is admitted when the replay's SLO of its length class (short: first token in
  0.5 s, long: 5 s) and the Gold tier's TPOT bound (36 ms, while a priority -1 request decodes)
  stay feasible, with the step model fitted to the H100 cost model.
- `slo_with_preemption`: the product ``slo`` preset with slot preemption declared
  (``"preemption": true``), for its ablation.
- `slo_gold_protected`: the product ``slo`` preset with the Gold tier (``--tenants
  servegen``'s priority -1) declared protected at the Gold class's TPOT (50 ms).
- `cache_without_waiting`: the ``cache`` preset with waiting-queue awareness off
  (``keep_waiting=False``), to measure what it buys.
- `cache_fixed_pins`: the ``cache`` preset with its session pins never paused
  (``SessionPins(judged=False)``), to measure what judging them against LRU does.
"""

from __future__ import annotations

import attrs

from benchmarks.replay.cost_model import StepCostModel
from benchmarks.replay.metrics import DEFAULT_SLOS, SHORT_PROMPT_TOKENS
from benchmarks.replay.step_time import fit_step_time_model
from benchmarks.replay.workloads import TENANT_WEIGHTS
from integrations.vllm_v1.config.presets import default_pipeline, preset
from integrations.vllm_v1.config.slo import SLOSpec, slo_pipeline
from integrations.vllm_v1.pipeline import Pipeline
from policies import PrefillLedger, SLOAdmission, SLOTarget, StepPrefillBudget, TokenCaps

STEP_PREFILL_TOKENS = 1024
"""The step bound of `decode_protected` and `slo_protected`."""
GOLD_TPOT_S = 0.036
"""`slo_protected`'s TPOT bound while a Gold (priority -1) request decodes: about half of stock
fcfs's Gold TPOT p99 at ``--rate-scale 4`` (72.8 ms), so that the p99 lands under 0.6x (at
40 ms, a 1,500-request run landed at 0.61x)."""


def decode_protected() -> Pipeline:
    """``default`` + `StepPrefillBudget` (1,024 prefill tokens a step while anything decodes)."""
    pipeline = default_pipeline(TENANT_WEIGHTS)
    budget = StepPrefillBudget(max_prefill_tokens=STEP_PREFILL_TOKENS, interactive_prompt_tokens=0)
    return attrs.evolve(pipeline, rate=TokenCaps(policies=(pipeline.rate, budget)))


def slo_protected(gpu: str = "h100", max_num_seqs: int = 256) -> Pipeline:
    """`decode_protected` with `SLOAdmission` (length classes, Gold TPOT bound)."""
    pipeline = decode_protected()
    ledger = PrefillLedger()
    slos = {name: SLOTarget(ttft_s=DEFAULT_SLOS[name].ttft_s, tpot_s=DEFAULT_SLOS[name].tpot_s)
            for name in ("short", "long")}
    admission = SLOAdmission(
        slos=slos, ledger=ledger,
        step_model=fit_step_time_model(StepCostModel.preset(gpu), max_decodes=max_num_seqs,
                                       max_prefill_tokens=STEP_PREFILL_TOKENS),
        max_prefill_tokens_per_step=STEP_PREFILL_TOKENS, headroom=0.9,
        protected_tpot_s={-1: GOLD_TPOT_S},
        length_classes=((SHORT_PROMPT_TOKENS - 1, "short"), (2**31, "long")))
    return attrs.evolve(pipeline, admission=admission,
                        rate=TokenCaps(policies=(*pipeline.rate.policies, ledger)))


def slo_with_preemption() -> Pipeline:
    """The ``slo`` preset with the replay's default declaration and slot preemption on."""
    return slo_pipeline(SLOSpec.parse({"preemption": True}))


def slo_gold_protected() -> Pipeline:
    """The ``slo`` preset with the replay's default declaration and priority -1 (Gold)
    protected at the Gold class's TPOT."""
    return slo_pipeline(SLOSpec.parse(
        {"protected_priorities": {"-1": DEFAULT_SLOS["gold"].tpot_s}}))


def cache_without_waiting() -> Pipeline:
    """The ``cache`` preset, its eviction order deaf to the waiting queue."""
    pipeline = preset("cache")
    return attrs.evolve(pipeline, eviction=attrs.evolve(pipeline.eviction, keep_waiting=False))


def cache_fixed_pins() -> Pipeline:
    """The ``cache`` preset, its session pins never judged against LRU (always on)."""
    pipeline = preset("cache")
    pins = attrs.evolve(pipeline.eviction.session_pins, judged=False)
    return attrs.evolve(pipeline, eviction=attrs.evolve(pipeline.eviction, session_pins=pins))
