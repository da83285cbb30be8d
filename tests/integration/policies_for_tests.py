"""Policies used only by engine tests; importable, so they reach the engine-core process."""

import attrs

from policies import AdmissionDecision


@attrs.frozen
class EchoProbeAdmission:
    """Rejects requests of class ``echo`` (overload) and ``quota`` (client quota), echoing the
    metadata the scheduler saw in the reason."""

    def admit(self, request, load):
        seen = f"echo tenant={request.tenant} priority={request.priority}"
        if request.slo_class == "echo":
            return AdmissionDecision.reject(seen, 2.5)
        if request.slo_class == "quota":
            return AdmissionDecision.reject(f"rate_limited {seen}", 7.0)
        return AdmissionDecision.accept()
