"""PD-aware scheduling defaults: what a prefill-only and a decode-only instance should run.

A role is a `Pipeline` plus the engine limits it needs (vLLM engine arguments,
not policies). The defaults were chosen on the ``mooncake-conv`` cluster replay
(``python -m benchmarks.pd_replay --scheduling stock,pd``; numbers in docs/pd.md):

- **prefill** (`PD_PREFILL`): cache-aware ranking with segmented-LRU eviction (a
  prompt whose prefix is cached costs little and goes first, before its blocks
  are evicted) and a 16k-token step budget (fewer, larger prefill steps). No
  decode protection: a prefill instance generates one token per request.
- **decode** (`PD_DECODE`): a `DecodeStepGate` that starts a request only while the
  decode step the batch would then run, predicted by a step-time model learned from
  the instance's own steps, takes at most twice a step's fixed cost (learned the same
  way), and the KV the batch holds stays within half the cache. That bounds the context
  each decode step reads, and so the inter-token latency, in time rather than in
  cache blocks, at the cost of queueing (TTFT) when decode instances are busy.
"""

from __future__ import annotations

import contextlib

import attrs

from integrations.vllm_v1.pipeline import Pipeline
from policies import CacheAwareRanker, DecodeStepGate, OnlineStepTimeModel, SegmentedLRU

DECODE_STEP_PRIOR_WEIGHT = 1e-3
"""How much the decode step model's conservative prior counts, in steps (see
`OnlineStepTimeModel.prior_weight`): a decode instance's batches span a narrow band of
contexts, where a prior of one step still pulls the fitted intercept, and so the gate's
bound, down by a fifth (6.1 ms against 7.8 on the H100 cost model); this one yields to the
instance's first steps."""


@attrs.frozen(kw_only=True)
class PDRole:
    """How the instances of one PD role schedule: a pipeline and the engine limits it needs."""

    pipeline: Pipeline | None = None
    """None: vLLM's stock scheduler (the identity `Pipeline` where a pipeline is required)."""
    max_num_batched_tokens: int | None = None
    """vLLM's per-step token budget (``--max-num-batched-tokens``); None keeps the engine's."""

    def applied_to(self, pipeline: Pipeline) -> Pipeline:
        """``pipeline`` with this role's policies in every slot it leaves at its default.

        Slots the caller set are kept, so a user's pipeline (fairness, admission, ...)
        runs on every instance and each role only adds what it needs. A role's gate that
        predicts with a step model (an attrs ``step_model`` field: `DecodeStepGate`) takes
        the caller's ``step_model`` (the one the engine feeds) where its validator accepts
        it (an `OnlineStepTimeModel`), else keeps the role's own.
        """
        if self.pipeline is None:
            return pipeline
        blank = Pipeline()
        merged = attrs.evolve(pipeline, **{
            field.name: getattr(self.pipeline, field.name) for field in attrs.fields(Pipeline)
            if getattr(pipeline, field.name) == getattr(blank, field.name)})
        gate, model = merged.start_gate, merged.step_model
        if (model is not None and attrs.has(type(gate))
                and "step_model" in attrs.fields_dict(type(gate)) and gate.step_model is not model):
            with contextlib.suppress(TypeError):  # the gate's validator refuses that model
                merged = attrs.evolve(merged, start_gate=attrs.evolve(gate, step_model=model))
        return merged

    def vllm_args(self) -> tuple[str, ...]:
        """Engine arguments for a vLLM server of this role (the pipeline travels separately)."""
        if self.max_num_batched_tokens is None:
            return ()
        return ("--max-num-batched-tokens", str(self.max_num_batched_tokens))


def pd_prefill_pipeline() -> Pipeline:
    """Prefill-only instances' policies: cache-aware order and segmented LRU."""
    return Pipeline(ranking=CacheAwareRanker(), eviction=SegmentedLRU())


def pd_decode_pipeline() -> Pipeline:
    """Decode-only instances' policies: start requests only while the predicted decode step
    stays within twice a step's fixed cost and KV usage at most 0.5 (one step model, learned
    from the instance's steps in the ``step_model`` slot, predicts for the gate)."""
    model = OnlineStepTimeModel(prior_weight=DECODE_STEP_PRIOR_WEIGHT)
    return Pipeline(step_model=model,
                    start_gate=DecodeStepGate(step_model=model, max_step_ratio=2.0,
                                              max_kv_usage=0.5))


PD_PREFILL = PDRole(pipeline=pd_prefill_pipeline(), max_num_batched_tokens=16384)
"""Prefill-only instances: cache-aware order, segmented LRU, a 16k-token step budget."""

PD_DECODE = PDRole(pipeline=pd_decode_pipeline())
"""Decode-only instances: start requests only while the predicted decode step stays within
twice a step's fixed cost (KV usage at most 0.5)."""

STOCK = PDRole()
"""vLLM's own ``fcfs`` scheduling and the engine's limits (the baseline)."""

PD_ROLES = {"prefill": PD_PREFILL, "decode": PD_DECODE}
"""The PD-aware role of each pool."""
