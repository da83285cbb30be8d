import sys, itertools
from benchmarks.replay.workloads import load_workload
from benchmarks.cache_replay.simulate import replay_order
from policies.adaptive_eviction import DuelingSLRU
from policies.session_retention import SessionPins
tr = load_workload(sys.argv[1], max_requests=3000)
chains=[r.block_hashes for r in tr.requests]
turns=[(r.session_id, r.arrival_s) for r in tr.requests]
sizes=[int(x) for x in sys.argv[2].split(",")]
for frac, slack in itertools.product([0.5,1.0],[1.0,1.5,2.0]):
  row=[]
  for size in sizes:
    o=DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=frac, gap_slack=slack))
    r=replay_order(chains,size,o,"x",turns=turns)
    row.append(round(100*r.hit_rate,2))
  print(frac, slack, row, flush=True)
