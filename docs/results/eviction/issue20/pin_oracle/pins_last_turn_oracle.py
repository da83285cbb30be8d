import sys, itertools, math
from benchmarks.replay.workloads import load_workload
from benchmarks.cache_replay.simulate import replay_order
from policies.adaptive_eviction import DuelingSLRU
from policies.session_retention import SessionPins, SessionGaps
tr = load_workload(sys.argv[1], max_requests=3000)
reqs=tr.requests
chains=[r.block_hashes for r in reqs]
turns=[(r.session_id, r.arrival_s) for r in reqs]
nxt={}; last={}
for i,r in enumerate(reqs):
    if r.session_id in last: nxt[last[r.session_id]]=r.arrival_s
    last[r.session_id]=i
sizes=[int(x) for x in sys.argv[2].split(",")]
for frac, slack in itertools.product([0.5,1.0],[1.5]):
  row=[]
  for size in sizes:
    o=DuelingSLRU(session_pins=SessionPins(max_pinned_fraction=frac, gap_slack=slack))
    class G(SessionGaps):
        i=0
        def finished(self, session, tail, now):
            u=SessionGaps.finished(self, session, tail, now)
            i=G.i; G.i+=1
            return u if i in nxt else now
    o._gaps=G(config=o.session_pins)
    r=replay_order(chains,size,o,"x",turns=turns)
    row.append(round(100*r.hit_rate,2))
  print("end-oracle", frac, slack, row, flush=True)
