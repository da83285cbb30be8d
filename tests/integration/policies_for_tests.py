"""Policies used only by engine tests; importable, so they reach the engine-core process."""

import attrs

from policies import AdmissionDecision


@attrs.frozen
class EchoMetadataAdmission:
    """Rejects every request, echoing the tenant and priority the scheduler saw."""

    def admit(self, request, load):
        return AdmissionDecision.reject(
            f"echo tenant={request.tenant} priority={request.priority} "
            f"class={request.slo_class}", 0.0)
