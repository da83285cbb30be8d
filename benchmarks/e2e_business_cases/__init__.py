"""The end-to-end business case: seven tenants through five escalating phases.

`workload` builds the phased 7-tenant trace on top of `benchmarks.replay.enterprise`;
`systems` names the four systems compared (stock ``fcfs`` and ``priority``, the
business pipeline, and the pipeline with the fixes); `study` replays the workload
through each on vLLM's real scheduler in virtual time and summarises every phase;
`report` and `plots` turn that summary into markdown and figures. Run it with
``python -m benchmarks.e2e_business_cases [--quick] --out DIR``.
"""
