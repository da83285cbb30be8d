"""Admission: who gets in.

The engine's admission policies (queue depth, KV watermarks) and the frontend's door
(concurrency limit, TTFT gate). Modules: `concurrency_limit`, `controller`, `frontend_gate`,
`watermarks`. Every name here is also exported by `policies`.
"""

from policies.admission.concurrency_limit import ConcurrencyLimit, ConcurrencyLimitStats
from policies.admission.controller import AdmissionController, AdmissionStats, QueueDepthLimit
from policies.admission.frontend_gate import FrontendGate, FrontendGateStats
from policies.admission.watermarks import KVWatermarks, WatermarkLevel

__all__ = [
    "AdmissionController",
    "AdmissionStats",
    "ConcurrencyLimit",
    "ConcurrencyLimitStats",
    "FrontendGate",
    "FrontendGateStats",
    "KVWatermarks",
    "QueueDepthLimit",
    "WatermarkLevel",
]
