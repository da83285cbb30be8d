"""Live overload benchmark: the ``slo`` preset against stock vLLM under real overload, measured
on the client (`run`, `workload`, `summary`, `plots`; ``python -m benchmarks.live_slo``)."""
