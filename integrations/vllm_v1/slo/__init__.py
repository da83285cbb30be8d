"""SLO serving features of `PolicyScheduler`: the engine's step time learned from its own
steps (`step_timing`) and priority preemption when every slot is taken (`preemption`)."""
