"""A pipeline for the Ray Serve tests, named by import path (it must import in every replica)."""

import attrs

from integrations.vllm_v1.config.presets import default_pipeline
from policies import AdmissionDecision

TENANT_WEIGHTS = {"gold": 4, "bronze": 1}


@attrs.frozen
class ProbeAdmission:
    """Rejects requests of SLO class ``probe`` (reason ``early_drop``, an overload: HTTP 503)."""

    def admit(self, request, load):
        if request.slo_class == "probe":
            return AdmissionDecision.reject(f"early_drop:probe tenant={request.tenant}", 1.0)
        return AdmissionDecision.accept()


def pipeline():
    """The ``default`` preset (WFQ, QoS, MLFQ, token bucket, watermarks), probe admission."""
    return attrs.evolve(default_pipeline(TENANT_WEIGHTS), admission=ProbeAdmission())
