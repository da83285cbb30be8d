"""Ordering: which request goes next.

Rankings (FCFS, QoS, EDF), tenant fair queuing, feedback levels and slot preemption. Modules:
`deadline`, `fairness`, `levels`, `ranking`, `slot_preemption`. Every name here is also exported
by `policies`.
"""

from policies.ordering.deadline import EDFRanker
from policies.ordering.fairness import WFQ, WFQStats
from policies.ordering.levels import MLFQ, MLFQStats
from policies.ordering.ranking import FCFSOrder, QoSRanker
from policies.ordering.slot_preemption import SlotPreemption, SlotPreemptionStats

__all__ = [
    "EDFRanker",
    "FCFSOrder",
    "MLFQ",
    "MLFQStats",
    "QoSRanker",
    "SlotPreemption",
    "SlotPreemptionStats",
    "WFQ",
    "WFQStats",
]
