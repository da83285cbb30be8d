"""SLO-aware serving: admit a request only if it, and everything admitted, can meet its SLO.

Three pieces, used together (`slo_pipeline` in the business case shows the composition):

* `TTFTDeadlineRanker` (the ``ranking`` slot) orders requests by their first-token deadline,
  ``arrival + ttft_s`` of their SLO class: prefill is served earliest deadline first (EDF).
* `PrefillLedger` (in the ``rate`` slot, beside other caps in `TokenCaps`) is a token-cap
  policy that never caps: it hears every prefill chunk the scheduler grants and keeps each
  admitted request's remaining prefill tokens, and the requests decoding.
* `SLOAdmission` (the ``admission`` slot) decides on arrival. With EDF on one server, a set
  of requests meets its deadlines if and only if, for every request, the prefill work served
  no later than it is done by its deadline; `SLOAdmission` admits a request when that test
  still passes with it added (for it, and for every admitted request served after it that
  passed before), with the prefill rate of `StepTimeModel` at the step's prefill bound, in
  the order the ranker serves (and, with ``arrivals_memory_s``, behind the tighter classes'
  arrivals still to come: `TighterArrivals`). Its TPOT is
  predicted as one step, ``step_s(running + 1, prefill per step, decoding context)``, and
  checked against its own target and the tightest among the requests decoding now, so a
  loose class is never admitted into a batch that would break a tight one.

A request that fails is rejected at once (reason ``slo_ttft`` or ``slo_tpot``, with a
Retry-After; over HTTP a 503), or, where its class names a lower one in ``demotions`` (the
tenant accepts it), admitted under that class if that class's targets pass. Admitting work
that will miss its SLO spends capacity on a request the client has given up on; rejecting it
early tells the client to retry elsewhere while the answer is still useful.

The predictions are model-based: calibrate `StepTimeModel` to the engine (in the replay,
`benchmarks.replay.step_time.fit_step_time_model`; on a GPU, from vLLM's step log) and
tune ``headroom``. The prefill bound should be the one the pipeline enforces
(`StepPrefillBudget.max_prefill_tokens`), so that steps, and so TPOT, are predictable.

One concern per module: `classes` (targets, class resolution, grants), `ledger` (the
admitted work), `feasibility` (the EDF test, pure functions), `waits` (when KV and slots
free up), `arrivals` (the work tighter classes will still add ahead), `step_room` (the
TPOT-bounded prefill per step), `feedback` (headrooms corrected by measurements), `path`
(the delays outside the engine step), `fairness` (shares between a class's tenants),
`decisions`, `admission` and `ranking`.
"""

from policies.slo.admission import SLOAdmission
from policies.slo.arrivals import TighterArrivals
from policies.slo.classes import ClassGrants, SLOTarget, resolve_class
from policies.slo.decisions import SLOAdmissionStats, SLODecision, SLOVerdict
from policies.slo.fairness import ClassFairShare, ClassFairShareStats
from policies.slo.feedback import HeadroomFeedback, PredictionFeedback
from policies.slo.ledger import RELEASE_QUANTILES, PrefillLedger, PrefillLedgerStats
from policies.slo.path import PathDelays, PathDelaysStats
from policies.slo.ranking import TTFTDeadlineRanker
from policies.slo.step_room import StepRoom
from policies.slo.waits import CapacityWaits

__all__ = [
    "RELEASE_QUANTILES",
    "CapacityWaits",
    "ClassFairShare",
    "ClassFairShareStats",
    "ClassGrants",
    "HeadroomFeedback",
    "PathDelays",
    "PathDelaysStats",
    "PredictionFeedback",
    "PrefillLedger",
    "PrefillLedgerStats",
    "SLOAdmission",
    "SLOAdmissionStats",
    "SLODecision",
    "SLOTarget",
    "SLOVerdict",
    "StepRoom",
    "TTFTDeadlineRanker",
    "TighterArrivals",
    "resolve_class",
]
