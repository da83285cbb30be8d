"""Prefill/decode disaggregation: where a request runs and when a decode instance starts it.

The router and its prefix index, the prefill/decode planner and the decode instance's start
gates. Modules: `index`, `planner`, `router`, `scheduling`. Its public names are exported by
`policies` (`from policies import ...`).
"""
