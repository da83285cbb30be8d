import sys
from benchmarks.replay.workloads import load_workload
from benchmarks.cache_replay import simulate as S
tr = load_workload(sys.argv[1], max_requests=3000)
chains=[r.block_hashes for r in tr.requests]
for size in [int(x) for x in sys.argv[2].split(",")]:
    o=S._OptOrder(chains)
    def tick(i): o.now=i
    r=S._replay(chains,size,o,"optnb",on_request=tick,bypass=False)
    print(size, "opt no bypass", round(100*r.hit_rate,2), flush=True)
