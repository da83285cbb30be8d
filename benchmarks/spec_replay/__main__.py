"""``python -m benchmarks.spec_replay``: model-free drafters replayed on real model outputs.

Example:

    python -m benchmarks.spec_replay --data spider --tokenizer gpt2 \\
        --proposers suffix_automaton,ngram,arctic --k 8,16,32 --max-requests 400 --out out/spec

Writes ``OUT/summary.json`` = ``{"results": [{proposer, k, tau, tau_d, acceptance, coverage,
propose_p50_us, propose_p99_us, update_us_per_token, bytes_per_token, requests,
output_tokens}, ...]}``, and with ``--sweep`` ``OUT/context_sweep.json`` (propose latency vs
context length), with ``--large-cache`` ``OUT/large_cache.json`` (replay with 1M+ tokens already
in the shared caches). Prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import attrs

from benchmarks.spec_replay.datasets import load_records, load_tokenizer
from benchmarks.spec_replay.proposers import arctic_available, make_proposers
from benchmarks.spec_replay.replay import replay, tokenize
from benchmarks.spec_replay.sweep import context_sweep, large_cache_replay

log = logging.getLogger("benchmarks.spec_replay")
WARMUP_REQUESTS = 3
"""Requests replayed through a throwaway instance of each proposer before the timed run."""
COLUMNS = ("proposer", "k", "tau", "tau_d", "acceptance", "coverage", "propose_p50_us",
           "propose_p99_us", "update_us_per_token", "bytes_per_token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True,
                        help="mt_bench, spider, humaneval, or a JSONL(.gz) path")
    parser.add_argument("--tokenizer", default="gpt2",
                        help="gpt2 (bundled) or a .tiktoken[.gz] path")
    parser.add_argument("--proposers", default="suffix_automaton,ngram,arctic")
    parser.add_argument("--k", default="32", help="comma-separated draft caps")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--sweep", action="store_true",
                        help="also time propose at 1k..128k-token contexts")
    parser.add_argument("--large-cache", action="store_true",
                        help="also replay with 1M+ MT-bench tokens pre-filled in the shared caches")
    parser.add_argument("--out", required=True, type=Path)
    return parser


def print_table(rows: list[dict]) -> None:
    """One line per row, the `COLUMNS` that are present."""
    cols = [c for c in COLUMNS if rows and c in rows[0]]
    print("  ".join(f"{c:>24}" if c == "proposer" else f"{c:>10}" for c in cols))
    for row in rows:
        print("  ".join(f"{row[c]:>24}" if c == "proposer" else f"{row[c]:>10}" for c in cols))


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    families = [f.strip() for f in args.proposers.split(",") if f.strip()]
    ks = [int(k) for k in args.k.split(",")]
    if "arctic" in families and not arctic_available():
        log.warning("arctic: skipped, arctic_inference is not installed (optional extra "
                    "'arctic'; build recipe in docs/speculative.md)")
    tokenizer = load_tokenizer(args.tokenizer)
    requests = tokenize(load_records(args.data, args.max_requests), tokenizer)
    results = []
    for k in ks:
        for family in families:
            for warm, timed in zip(make_proposers(family, k), make_proposers(family, k),
                                   strict=True):
                replay(warm, requests[:WARMUP_REQUESTS], k)  # JIT / cache loads, untimed
                results.append(attrs.asdict(replay(timed, requests, k)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"results": results}, indent=2) + "\n")
    print_table(results)
    if args.sweep:
        rows = context_sweep(tokenizer, families, k=max(ks))
        (args.out / "context_sweep.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
        for row in rows:
            print(f"{row['proposer']:>24}  context {row['context_tokens']:>7}  "
                  f"p50 {row['propose_p50_us']:>9} us  p99 {row['propose_p99_us']:>9} us  "
                  f"build {row['build_ms']:>9} ms")
    if args.large_cache:
        rows = large_cache_replay(tokenizer, requests, families, max(ks))
        (args.out / "large_cache.json").write_text(json.dumps({"results": rows}, indent=2) + "\n")
        print_table(rows)
        for row in rows:
            print(f"{row['proposer']}: {row['cache_tokens']} tokens pre-filled in "
                  f"{row['prefill_s']} s")


if __name__ == "__main__":
    main()
