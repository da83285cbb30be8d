"""A pipeline users can serve: ``python -m integrations.vllm_v1.serving --pipeline examples/my_pipeline.py:PIPELINE --model MODEL``.

Clients then send ``priority`` (-20..20, lower is more urgent) and
``vllm_xargs={"tenant": ..., "slo_class": ..., "deadline_ms": ...}``. A full queue
or an early drop is answered with HTTP 503, a full ``bronze`` class with 429, both
with ``Retry-After``.
"""

import random

from integrations.vllm_v1 import Pipeline
from policies import AdmissionController, QoSRanker

PIPELINE = Pipeline(
    ranking=QoSRanker(priority_step_s=2.0),
    admission=AdmissionController(max_waiting=512, red_min_waiting=256, red_max_waiting=512,
                                  max_waiting_per_class={"bronze": 128},
                                  rng=random.Random(0)),
)
