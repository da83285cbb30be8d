"""``python -m benchmarks.live_slo.rejudge DIR``: judge a finished run's requests again.

Reads ``DIR/summary.json`` and every ``DIR/runs/<scenario>/seed<k>/<system>/requests.jsonl``
(unpacked from ``requests.tar.gz`` where the run was archived), judges each request with
the current `benchmarks.live_slo.summary` rules and rewrites ``summary.json`` (the old one
kept as ``summary.before_rejudge.json``), its goals and plots. The requests themselves are
what the client measured; only the judgement changes.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from benchmarks.e2e_business_cases.live_client import HttpReply
from benchmarks.live_slo.plots import plot_all
from benchmarks.live_slo.summary import evaluate_goals, run_metrics
from benchmarks.live_slo.workload import Scenario
from benchmarks.replay.records import RequestRecord


def records_from(path: Path) -> tuple[list[RequestRecord], list[HttpReply]]:
    """The records and replies one ``requests.jsonl`` holds (token times rebuilt evenly
    from its first token, time per token and count, which keeps its TTFT and TPOT)."""
    records, replies = [], []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        record = RequestRecord(request_id=row["id"], arrival_s=row["arrival_s"],
                               prompt_tokens=row["prompt_tokens"],
                               output_tokens=row["max_tokens"], tenant=row["tenant"],
                               priority=0, slo_class=row["class"])
        first, tokens = row["first_token_s"], row["tokens"]
        if first is not None:
            record.token_times_s = [first + k * (row["tpot_s"] or 0.0) for k in range(tokens)]
        if row["outcome"] is not None:
            record.finish(row["outcome"], row["finish_s"], row["reason"])
        records.append(record)
        replies.append(HttpReply(send_lag_s=row["send_lag_s"], status=row["status"],
                                 retry_after=row["retry_after"], body=row["body"]))
    return records, replies


def rejudge(out: Path) -> dict:
    """The summary of the run in ``out``, judged again (see the module docs)."""
    summary = json.loads((out / "summary.json").read_text())
    capacity_rps = summary["capacity"]["capacity_rps"]
    runs: dict[str, dict[str, dict[str, dict]]] = {}
    for name, fields in summary["config"]["scenarios"].items():
        scenario = Scenario(**fields)
        for seed in summary["config"]["seeds"]:
            arrivals = scenario.arrivals(capacity_rps, random.Random(f"{seed}:{name}"))
            for system in summary["config"]["systems"]:
                path = (out / "runs" / name / f"seed{seed}" / system.replace(":", "_")
                        / "requests.jsonl")
                records, replies = records_from(path)
                runs.setdefault(name, {}).setdefault(str(seed), {})[system] = run_metrics(
                    records, replies, window_s=scenario.window_s(arrivals))
    return {**summary, "runs": runs,
            "goals": evaluate_goals(runs, summary["config"]["scenarios"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a live_slo output directory")
    args = parser.parse_args(argv)
    summary = rejudge(args.out)
    shutil.copyfile(args.out / "summary.json", args.out / "summary.before_rejudge.json")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_all(summary, args.out)
    return summary


if __name__ == "__main__":
    main()
