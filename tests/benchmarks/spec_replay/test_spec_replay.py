"""``python -m benchmarks.spec_replay``: datasets, replay accounting and the summary schema."""

import gzip
import json

import numpy as np
import pytest

from benchmarks.spec_replay.__main__ import main
from benchmarks.spec_replay.datasets import load_records, load_tokenizer
from benchmarks.spec_replay.replay import TokenizedRequest, accepted_prefix, replay

SCHEMA = {"proposer", "k", "tau", "tau_d", "acceptance", "coverage", "propose_p50_us",
          "propose_p99_us", "update_us_per_token", "bytes_per_token", "requests",
          "output_tokens"}


@pytest.mark.parametrize(("name", "count"), [("mt_bench", 160), ("spider", 1034),
                                             ("humaneval", 164)])
def test_builtin_datasets_load_in_arrival_order(name, count):
    records = load_records(name)
    assert len(records) == count
    assert all(r.prompt and r.output is not None for r in records)


def test_bundled_gpt2_tokenizer_matches_the_reference_ids():
    assert load_tokenizer("gpt2").encode_ordinary("Hello world") == [15496, 995]


def test_accepted_prefix():
    truth = np.array([1, 2, 3])
    assert accepted_prefix([1, 2, 9], truth) == 2
    assert accepted_prefix([1, 2, 3, 4], truth) == 3
    assert accepted_prefix([], truth) == 0


class EchoProposer:
    """Drafts the true continuation: every step accepts the whole draft."""

    name = "oracle"

    def __init__(self, output):
        self.output, self.pos = output, 0

    def start(self, request_id, prompt):
        self.pos = 0

    def propose(self, request_id, context, k):
        return self.output[self.pos:self.pos + k].tolist()

    def update(self, request_id, tokens):
        self.pos += len(tokens)

    def finish(self, request_id):
        pass

    def bytes_per_token(self):
        return 0.0


def test_replay_accounting_with_a_perfect_drafter():
    output = np.arange(10, dtype=np.int32)
    request = TokenizedRequest(id="r", prompt=np.array([0], np.int32), output=output)
    result = replay(EchoProposer(output), [request], k=4)
    # Steps emit 5, 5 tokens (4 accepted + bonus), then nothing is left.
    assert (result.tau, result.tau_d, result.acceptance) == (5.0, 5.0, 1.0)
    assert result.output_tokens == 10 and result.coverage == 1.0


def test_cli_writes_the_summary_schema(tmp_path):
    data = tmp_path / "d.jsonl.gz"
    rows = [{"id": i, "session": "s", "prompt": "SELECT name FROM users WHERE",
             "output": " id = 1; SELECT name FROM users WHERE id = 2;"} for i in range(4)]
    with gzip.open(data, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    main(["--data", str(data), "--proposers", "suffix_automaton", "--k", "8,16",
          "--out", str(tmp_path / "out")])
    results = json.loads((tmp_path / "out" / "summary.json").read_text())["results"]
    assert [(r["proposer"], r["k"]) for r in results] == [("suffix_automaton", 8),
                                                         ("suffix_automaton", 16)]
    assert all(set(r) == SCHEMA for r in results)
    assert all(r["requests"] == 4 and r["tau"] > 1.5 for r in results)
