"""A linear `StepTimeModel` fitted to the replay's step-cost model, for policies that predict.

`policies.slo.SLOAdmission` predicts TTFT and TPOT with a linear step time
(``base_s + decode_s_per_seq · decodes + prefill_s_per_token · prefill tokens``). In the
replay the engine's steps are priced by `StepCostModel`; `fit_step_time_model` fits the linear
model to it by least squares over the batches a loaded engine runs (decodes up to
``max_num_seqs``, a prefill chunk up to the bound in force), so a policy's model and the
replay's clock agree. On a real engine, fit the same three numbers to its step log instead.
"""

from __future__ import annotations

import numpy as np

from benchmarks.replay.cost_model import PrefillChunk, StepBatch, StepCostModel
from policies.step_model import StepTimeModel


def fit_step_time_model(cost_model: StepCostModel, *, max_decodes: int, max_prefill_tokens: int,
                        max_context_tokens: int = 8192, cached_tokens: int = 512
                        ) -> StepTimeModel:
    """Least-squares `StepTimeModel` over a grid of steps priced by ``cost_model``.

    The grid: 0 to ``max_decodes`` decoding sequences of 512 to ``max_context_tokens`` context
    each, and a prefill chunk of 0 to ``max_prefill_tokens`` tokens after ``cached_tokens``
    (not both empty).
    """
    rows, times = [], []
    for decodes in np.linspace(0, max_decodes, 9).astype(int):
        for context in np.linspace(512, max_context_tokens, 5).astype(int):
            for prefill in np.linspace(0, max_prefill_tokens, 9).astype(int):
                if not decodes and not prefill:
                    continue
                batch = StepBatch(
                    prefills=(PrefillChunk(tokens=int(prefill), cached_tokens=cached_tokens),)
                    if prefill else (),
                    decode_context_tokens=(int(context),) * int(decodes))
                rows.append((1.0, decodes, decodes * context, prefill))
                times.append(cost_model.step_time_s(batch))
    coefficients, *_ = np.linalg.lstsq(np.asarray(rows, dtype=float), np.asarray(times),
                                       rcond=None)
    base, per_seq, per_context, per_token = (max(float(c), 0.0) for c in coefficients)
    return StepTimeModel(base_s=base, decode_s_per_seq=per_seq,
                         decode_s_per_context_token=per_context, prefill_s_per_token=per_token)
