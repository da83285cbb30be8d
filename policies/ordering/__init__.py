"""Ordering: which request goes next.

Rankings (FCFS, QoS, EDF), tenant fair queuing, feedback levels and slot preemption. Modules:
`deadline`, `fairness`, `levels`, `ranking`, `slot_preemption`. Its public names are exported
by `policies` (`from policies import ...`).
"""
