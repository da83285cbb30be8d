"""Regenerate the tiny model's corpus and byte-level BPE tokenizer (run by hand, not at import).

Usage, from the repository root::

    python integrations/vllm_v1/instruments/tiny_model_data/make_tokenizer.py            # retrain from corpus.jsonl
    python integrations/vllm_v1/instruments/tiny_model_data/make_tokenizer.py --mt-bench ../shared/data/outputs/mt_bench

With ``--mt-bench DIR`` the corpus is first rebuilt from MT-bench's ``question.jsonl`` and
``model_answer/gpt-4.jsonl`` (FastChat, Apache-2.0; see ATTRIBUTION.md). The trained
``tokenizer.json`` is committed: `tiny_model.py` copies it and never trains at build time, so
model directories stay byte-identical whatever `tokenizers` version is installed.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus.jsonl"
TOKENIZER = HERE / "tokenizer.json"

VOCAB_SIZE = 4096
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)  # ids 0..5, in this order


def write_corpus(mt_bench: pathlib.Path) -> None:
    """Rebuild corpus.jsonl: every MT-bench question turn, then every GPT-4 answer turn."""
    texts: list[str] = []
    with open(mt_bench / "question.jsonl", encoding="utf-8") as f:
        for line in f:
            texts.extend(json.loads(line)["turns"])
    with open(mt_bench / "model_answer" / "gpt-4.jsonl", encoding="utf-8") as f:
        for line in f:
            texts.extend(json.loads(line)["choices"][0]["turns"])
    with open(CORPUS, "w", encoding="utf-8", newline="\n") as f:
        for text in texts:
            f.write(json.dumps(text, ensure_ascii=False) + "\n")


def train() -> Tokenizer:
    """Train a GPT-2-style byte-level BPE on corpus.jsonl with a `<s> $A` post-processor."""
    with open(CORPUS, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mt-bench", type=pathlib.Path, help="rebuild corpus.jsonl from this dir")
    parser.add_argument("--out", type=pathlib.Path, default=TOKENIZER)
    args = parser.parse_args()
    if args.mt_bench is not None:
        write_corpus(args.mt_bench)
    tokenizer = train()
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    tokenizer.save(str(args.out), pretty=True)


if __name__ == "__main__":
    main()
