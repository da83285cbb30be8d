"""Hit rates of DuelingSLRU sampling variants on one trace (exploration, not shipped)."""
import json
import sys
import time

from benchmarks.cache_replay.__main__ import run as run_policy
from benchmarks.cache_replay.prefix_models import enterprise_chains
from benchmarks.cache_replay.simulate import replay_order
from benchmarks.replay.workloads import load_workload
from policies.kv.eviction import DuelingSLRU

trace_name, prefix, sizes, variants, out = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")], sys.argv[4].split(";"), sys.argv[5]
trace = load_workload(trace_name)
chains = enterprise_chains(trace) if prefix == "enterprise" else [r.block_hashes for r in trace.requests]
turns = [(r.session_id, r.arrival_s) for r in trace.requests]
rows = []
for size in sizes:
    for v in variants:
        t = time.time()
        if v in ("lru", "opt", "slru", "dueling", "shipped"):
            r = run_policy(chains, size, v, turns, 0)
        else:
            s, m = map(int, v.split("/"))
            r = replay_order(chains, size, DuelingSLRU(shadow_sample=s, min_shadow_blocks=m), v, turns=turns)
        rows.append({"trace": trace_name, "size": size, "variant": v, "hit_rate": r.hit_rate})
        print(trace_name, size, v, f"{100*r.hit_rate:.2f}", f"{time.time()-t:.0f}s", flush=True)
json.dump(rows, open(out, "w"), indent=1)
