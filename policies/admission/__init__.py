"""Admission: who gets in.

The engine's admission policies (queue depth, KV watermarks) and the frontend's door
(concurrency limit, TTFT gate). Modules: `concurrency_limit`, `controller`, `frontend_gate`,
`watermarks`. Its public names are exported by `policies` (`from policies import ...`).
"""
