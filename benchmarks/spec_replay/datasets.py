"""Real model outputs for speculative-decoding replay, and the GPT-2 tokenizer.

Built-in datasets (files under ``benchmarks/data/outputs``, see ``ATTRIBUTION.md`` there), each a
list of `OutputRecord` in arrival order:

- ``mt_bench``: MT-bench, GPT-4's official answers; 80 questions x 2 turns = 160 requests. Turn 2's
  prompt is turn 1's question and answer followed by the second question.
- ``spider``: Spider 1.0 dev questions with DAIL-SQL + GPT-4 predictions (1,034, dataset order).
- ``humaneval``: Reflexion's HumanEval run with GPT-4 (simple strategy): prompt = the function
  stub, output = GPT-4's solution (164).
- ``mt_bench_all``: the answers of all 31 MT-bench models (2,480 x 2 turns of text), used to fill
  a shared cache with over a million real tokens.

Any other name is a path to JSONL (optionally gzip'd) with one ``{"id", "session", "prompt",
"output"}`` object a line, in arrival order.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import attrs

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "outputs"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
"""GPT-2's pre-tokenisation regex (tiktoken's ``r50k`` pattern)."""
BUILTIN = ("mt_bench", "spider", "humaneval")


@attrs.frozen(kw_only=True)
class OutputRecord:
    """One request of a replay: its prompt and the output the model really produced."""

    id: str
    session: str
    prompt: str
    output: str


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(
        path, encoding="utf-8")


def _jsonl(path: Path) -> Iterator[dict]:
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _mt_bench_turns(model_file: Path) -> list[OutputRecord]:
    questions = {q["question_id"]: q["turns"] for q in _jsonl(DATA_DIR / "mt_bench" / "question.jsonl.gz")}
    records = []
    for answer in _jsonl(model_file):
        qid = answer["question_id"]
        (q1, q2), (a1, a2) = questions[qid], answer["choices"][0]["turns"]
        records.append(OutputRecord(id=f"{qid}-1", session=str(qid), prompt=q1, output=a1))
        records.append(OutputRecord(id=f"{qid}-2", session=str(qid),
                                    prompt=f"{q1}\n\n{a1}\n\n{q2}", output=a2))
    return records


def _spider() -> list[OutputRecord]:
    with _open_text(DATA_DIR / "text2sql" / "spider_dev.json.gz") as f:
        dev = json.load(f)
    with _open_text(DATA_DIR / "text2sql" / "DAIL-SQL+GPT-4.txt.gz") as f:
        predictions = f.read().splitlines()
    return [OutputRecord(id=str(i), session=q["db_id"], prompt=q["question"], output=sql)
            for i, (q, sql) in enumerate(zip(dev, predictions, strict=True))]


def _humaneval() -> list[OutputRecord]:
    path = DATA_DIR / "reflexion" / "simple_test_run_simple_1_gpt-4_pass_at_k_1.jsonl.gz"
    return [OutputRecord(id=r["task_id"], session=r["task_id"], prompt=r["prompt"],
                         output=r["solution"]) for r in _jsonl(path)]


def mt_bench_all_models(exclude_model: str = "") -> list[OutputRecord]:
    """MT-bench answers of every model (file order), ids ``MODEL/QUESTION-TURN``."""
    records = []
    for path in sorted((DATA_DIR / "mt_bench" / "model_answer").glob("*.jsonl.gz")):
        model = path.name.removesuffix(".jsonl.gz")
        if model != exclude_model:
            records += [attrs.evolve(r, id=f"{model}/{r.id}") for r in _mt_bench_turns(path)]
    return records


def load_records(name_or_path: str, max_requests: int | None = None) -> list[OutputRecord]:
    """A built-in dataset by name, or a JSONL(.gz) file of ``{id, session, prompt, output}``."""
    if name_or_path == "mt_bench":
        records = _mt_bench_turns(DATA_DIR / "mt_bench" / "model_answer" / "gpt-4.jsonl.gz")
    elif name_or_path == "mt_bench_all":
        records = mt_bench_all_models()
    elif name_or_path == "spider":
        records = _spider()
    elif name_or_path == "humaneval":
        records = _humaneval()
    else:
        path = Path(name_or_path)
        if not path.exists():
            raise SystemExit(f"--data: no built-in dataset or file named {name_or_path!r} "
                             f"(built-ins: {', '.join(BUILTIN)})")
        records = [OutputRecord(id=str(r["id"]), session=str(r.get("session", r["id"])),
                                prompt=r["prompt"], output=r["output"]) for r in _jsonl(path)]
    return records[:max_requests] if max_requests else records


@functools.cache
def gpt2_tokenizer(path: str | None = None):
    """GPT-2 BPE from the bundled ``gpt2.tiktoken.gz`` (or another ``.tiktoken[.gz]`` file)."""
    import tiktoken

    ranks_path = Path(path) if path else DATA_DIR / "tokenizers" / "gpt2.tiktoken.gz"
    ranks = {}
    with _open_text(ranks_path) as f:
        for line in f:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(name=ranks_path.name.split(".")[0], pat_str=GPT2_PATTERN,
                             mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})


def load_tokenizer(name: str):
    """``gpt2`` (bundled) or a path to a ``.tiktoken[.gz]`` rank file with GPT-2's regex."""
    return gpt2_tokenizer(None if name == "gpt2" else name)
