"""The tiny model directory is deterministic, cached, and loads offline as a real Llama."""

import filecmp
import os
import threading

import pytest

from integrations.vllm_v1.instruments.tiny_model import CACHE_ENV_VAR, TinyModelSpec, tiny_model_dir

PROMPTS = ["Hello there", "The capital of France", "def fibonacci(n):", "1 2 3 4 5"]


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return tiny_model_dir("random", cache_dir=tmp_path_factory.mktemp("cache"))


def test_two_builds_are_byte_identical(tmp_path, random_dir):
    other = tiny_model_dir("random", cache_dir=tmp_path)
    assert other != random_dir and other.name == random_dir.name
    names = sorted(os.listdir(random_dir))
    assert names == sorted(os.listdir(other))
    assert "model.safetensors" in names
    match, mismatch, errors = filecmp.cmpfiles(random_dir, other, names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_dummy_flavour_has_no_weights(tmp_path):
    path = tiny_model_dir(cache_dir=tmp_path)
    assert path.name.startswith("tiny-llama-dummy-")
    assert sorted(os.listdir(path)) == [
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_second_call_is_a_cache_hit(tmp_path):
    first = tiny_model_dir("dummy", cache_dir=tmp_path)
    (first / "sentinel").write_text("kept")
    second = tiny_model_dir("dummy", cache_dir=tmp_path)
    assert second == first
    assert (second / "sentinel").read_text() == "kept"
    assert os.listdir(tmp_path) == [first.name]  # no leftover temporary directories


def test_cache_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    assert tiny_model_dir().parent == tmp_path


def test_spec_or_flavour_change_gives_a_new_directory(tmp_path):
    names = {
        tiny_model_dir("dummy", cache_dir=tmp_path).name,
        tiny_model_dir("random", cache_dir=tmp_path).name,
        tiny_model_dir("random", cache_dir=tmp_path, spec=TinyModelSpec(seed=1)).name,
    }
    assert len(names) == 3
    assert sorted(os.listdir(tmp_path)) == sorted(names)


def test_concurrent_builders_agree_and_leave_no_temporaries(tmp_path):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny_model_dir(cache_dir=tmp_path)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert os.listdir(tmp_path) == [results[0].name]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head_dim": 16, "hidden_size": 32}, "head_dim must be one of"),
        ({"hidden_size": 100}, "hidden_size (100) must equal"),
        ({"num_key_value_heads": 3, "num_attention_heads": 2}, "must divide"),
        ({"vocab_size": 1000}, "vocab_size must be >= 4096"),
        ({"logit_std": 0.0}, "logit_std must be > 0"),
    ],
)
def test_spec_rejects_shapes_the_cpu_engine_cannot_run(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TinyModelSpec(**kwargs)


def test_unknown_flavour_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="weights must be 'dummy' or 'random'"):
        tiny_model_dir("zeros", cache_dir=tmp_path)  # type: ignore[arg-type]


def test_config_is_a_float32_llama_for_autoconfig(random_dir):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(random_dir, local_files_only=True)
    assert config.model_type == "llama"
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (128, 2, 64)
    assert config.vocab_size == 4096
    assert str(config.dtype) == "torch.float32"


def test_tokenizer_round_trips_text(random_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(random_dir, local_files_only=True)
    assert len(tokenizer) == 4096
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1)
    for text in [*PROMPTS, "Ünïcödé → 東京 🚀\n\n\tindented", "  leading and trailing  "]:
        ids = tokenizer(text).input_ids
        assert ids[0] == tokenizer.bos_token_id and tokenizer.bos_token_id not in ids[1:]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(tokenizer("The capital of France").input_ids) < len("The capital of France")


def test_chat_template_marks_roles_and_starts_with_bos(random_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(random_dir, local_files_only=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi!</s>\n<|assistant|>\n"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids


def test_random_weights_make_greedy_tokens_depend_on_the_context(random_dir):
    # Every prompt ends in the same token " is": near-uniform (dummy-like) weights make the next
    # token a function of the last token only, so they would pick one token for all four.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(random_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        random_dir, dtype=torch.float32, local_files_only=True
    )
    assert model.dtype == torch.float32
    prompts = [
        "The capital of France is",
        "My favourite colour is",
        "The answer to the question is",
        "What is",
    ]
    next_tokens = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert tokenizer.convert_ids_to_tokens(int(ids[0, -1])) == "\u0120is"
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        top2 = logits.topk(2).values
        assert logits.std() > 1.0  # far from the near-uniform logits of dummy weights
        assert top2[0] - top2[1] > 1e-3  # the greedy choice is not a float32 coin toss
        next_tokens.append(int(logits.argmax()))
    assert len(set(next_tokens)) == len(prompts)
