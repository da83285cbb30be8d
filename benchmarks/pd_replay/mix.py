"""A trace whose mix shifts: windows of real traces played one after the other.

``python -m benchmarks.pd_replay.mix --out mix.jsonl`` writes the first 300 s of
Azure's code trace (long prompts, short outputs: prefill-heavy) followed by the
first 300 s of Azure's conversation trace (short prompts, long outputs:
decode-heavy), each at ``--rate-scale`` times its rate: the real arrival times and
lengths of both, only shifted in time. `PDPlanner` should move decode instances in
when the second part starts (``python -m benchmarks.pd_replay --plan --trace mix.jsonl``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import attrs

from benchmarks.replay.trace import Trace, write_jsonl
from benchmarks.replay.workloads import load_workload


def shifted_mix(names: Sequence[str], *, seconds_each: float, rate_scale: float = 1.0) -> Trace:
    """The first ``seconds_each`` (after scaling) of each named trace, back to back."""
    requests, offset = [], 0.0
    for part, name in enumerate(names):
        trace = load_workload(name).scaled(rate_scale)
        start = trace.requests[0].arrival_s
        window = [r for r in trace.requests if r.arrival_s - start < seconds_each]
        requests += [attrs.evolve(r, request_id=f"{part}-{r.request_id}",
                                  arrival_s=offset + r.arrival_s - start, block_hashes=())
                     for r in window]
        offset += seconds_each
    return Trace(name="+".join(names), requests=tuple(requests))


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="azure-code,azure-conv")
    parser.add_argument("--seconds-each", type=float, default=300.0)
    parser.add_argument("--rate-scale", type=float, default=4.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    trace = shifted_mix(args.traces.split(","), seconds_each=args.seconds_each,
                        rate_scale=args.rate_scale)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(trace, args.out)
    print(f"wrote {len(trace.requests)} requests ({trace.duration_s:.0f} s) to {args.out}")
    return args.out


if __name__ == "__main__":
    main()
