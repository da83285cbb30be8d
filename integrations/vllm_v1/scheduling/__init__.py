"""How waiting and running requests are ordered, admitted, rate-capped and accounted: `PolicyScheduler` and its hooks."""
