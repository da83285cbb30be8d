"""Policies used only by engine tests; importable, so they reach the engine-core process."""

import attrs

from policies import AdmissionDecision


@attrs.frozen
class EchoProbeAdmission:
    """Rejects requests of class ``echo``, echoing the metadata the scheduler saw."""

    def admit(self, request, load):
        if request.slo_class != "echo":
            return AdmissionDecision.accept()
        return AdmissionDecision.reject(
            f"echo tenant={request.tenant} priority={request.priority}", 0.0)
