"""Policies used only by the serving engine tests; importable, so they reach the engine process."""

import attrs

from policies import AdmissionDecision


@attrs.frozen
class ProbeAdmission:
    """Rejects on demand, echoing the metadata the scheduler saw in the rejection's detail:
    class ``drop`` or priority 13 (``early_drop``, 2.5 s: overload), class ``quota``
    (``class_full``, 7 s: the client's quota); and any request while ``max_waiting``
    requests wait (``queue_full``, 30 s)."""

    max_waiting: int = 6

    def admit(self, request, load):
        seen = f"tenant={request.tenant} priority={request.priority}"
        if request.slo_class == "drop" or request.priority == 13:
            return AdmissionDecision.reject(f"early_drop:{seen}", 2.5)
        if request.slo_class == "quota":
            return AdmissionDecision.reject(f"class_full:quota {seen}", 7.0)
        if load.waiting_requests >= self.max_waiting:
            return AdmissionDecision.reject("queue_full", 30.0)
        return AdmissionDecision.accept()
