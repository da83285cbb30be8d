"""``python -m benchmarks.e2e_business_cases``: the business case, stock vLLM vs the pipelines.

Example:

    python -m benchmarks.e2e_business_cases --quick --out out/business_case

Replays the five-phase, seven-tenant workload (`workload`) through every system
(`systems`; ``stock+queue-caps`` is a sweep of vLLM's own frontend admission settings, the
best reported) on vLLM's real scheduler in virtual time and writes ``OUT/summary.json``
(`study`), ``OUT/report.md`` (`report`) and the figures of `plots.FIGURES`; prints the
headline table and the targets. With ``--live``, plays a scaled-down version of the same
workload through real CPU vLLM servers over HTTP instead (`live`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.e2e_business_cases.live import LIVE_SYSTEMS, main_live
from benchmarks.e2e_business_cases.plots import FIGURES, plot_all
from benchmarks.e2e_business_cases.report import console_table, markdown_report
from benchmarks.e2e_business_cases.study import run_study
from benchmarks.e2e_business_cases.systems import PIPELINES, SYSTEMS
from benchmarks.e2e_business_cases.workload import business_workload
from benchmarks.replay.systems import QUEUE_CAPS, expand_systems

PHASE_S = 60.0
QUICK_PHASE_S = 30.0
"""``--quick``: the same rates and phases, each 30 s instead of 60 s."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help=f"phases of {QUICK_PHASE_S:.0f} s instead of {PHASE_S:.0f} s")
    parser.add_argument("--phase-s", type=float, default=None,
                        help="seconds per phase (overrides --quick)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated systems (default: {','.join(SYSTEMS)}; also "
                             f"{','.join(p for p in PIPELINES if p not in SYSTEMS)} and "
                             f"{QUEUE_CAPS}:BASE[:reqs=N][:tokens=N]; {QUEUE_CAPS} alone "
                             "replays a sweep of settings and reports the best; "
                             f"with --live: {','.join(LIVE_SYSTEMS)})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="systems replayed at once, each in its own process (default: "
                             "the CPU count; the results do not depend on it)")
    parser.add_argument("--max-tokens", choices=("output", "context"), default="output",
                        help="what clients send as max_tokens: each answer's length (policies "
                             "see it), or the rest of the context window (they do not: the "
                             "answer still ends at its length, by a stop token)")
    parser.add_argument("--live-load", type=float, default=1.0,
                        help="with --live: every tenant's rate times this (the default scale "
                             "does not overload the CPU engine; see docs/results/live_slo.md)")
    parser.add_argument("--live", action="store_true",
                        help="a scaled-down run through real CPU vLLM servers over HTTP "
                             "(writes live_summary.json, live_report.md; see `live`)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.live:
        return main_live(args.out, quick=args.quick, seed=args.seed,
                         systems=(args.systems or ",".join(LIVE_SYSTEMS)).split(","),
                         max_tokens=args.max_tokens, load=args.live_load)
    started = time.perf_counter()
    phase_s = args.phase_s or (QUICK_PHASE_S if args.quick else PHASE_S)
    workload = business_workload(seed=args.seed, phase_s=phase_s)
    systems = (args.systems or ",".join(SYSTEMS)).split(",")
    replayed = expand_systems(systems)
    with tqdm(total=len(workload.trace.requests) * len(replayed), unit="req") as bar:
        def progress(system: str):
            bar.set_description(system)
            return bar.update

        summary = run_study(workload, systems=systems, jobs=args.jobs, progress=progress,
                            max_tokens=args.max_tokens)
    summary["config"]["seed"] = args.seed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "report.md").write_text(markdown_report(summary) + "\n")
    plot_all(summary, args.out)
    print(console_table(summary))
    print(f"\nwrote summary.json, report.md, {', '.join(FIGURES)} to {args.out} "
          f"in {time.perf_counter() - started:.0f} s")
    return summary


if __name__ == "__main__":
    main()
