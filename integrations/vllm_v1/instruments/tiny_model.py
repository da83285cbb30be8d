"""A tiny Llama model directory built offline, for running the real vLLM engine on CPU.

`tiny_model_dir()` writes (once, then caches) a directory that vLLM and transformers load like
any Hugging Face checkpoint, without the hub:

- ``config.json``: a 2-layer Llama (hidden 128, 2 heads of 64, vocab 4096), float32.
- ``tokenizer.json`` and friends: a real byte-level BPE (trained on MT-bench text, see
  ``tiny_model_data/ATTRIBUTION.md``) with ``<s>``/``</s>`` and a chat template, so
  ``/v1/chat/completions`` works.
- ``model.safetensors`` (``weights="random"`` only, ~6 MB): random weights from a fixed seed.

Two flavours:

- ``"dummy"``: no weight file; start vLLM with ``load_format="dummy"``. Its logits are near
  uniform, so every prompt gives the same greedy text: use it for timing and demos only.
- ``"random"``: seeded random weights scaled so that greedy outputs depend on the prompt, with
  clear top-1 margins. Use it for any test that compares outputs (identity pipeline, speculative
  decoding, KV transfer).

Example:
    >>> from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir
    >>> path = tiny_model_dir("random")  # doctest: +SKIP
    >>> llm = vllm.LLM(model=str(path), dtype="float32", max_model_len=512, ...)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import shutil
import tempfile
from typing import Any, Literal

import attrs

__all__ = ["TinyModelSpec", "tiny_model_dir", "CACHE_ENV_VAR"]

CACHE_ENV_VAR = "LLM_SERVING_POLICIES_CACHE"
"""Environment variable naming the cache root (default ``~/.cache/llm-serving-policies``)."""

_FORMAT_VERSION = 1  # bump when the files written change for the same spec
_DATA_DIR = pathlib.Path(__file__).resolve().parent / "tiny_model_data"
_TOKENIZER_VOCAB_SIZE = 4096
_BOS, _EOS, _PAD = "<s>", "</s>", "<pad>"  # ids 0, 1, 2 in tokenizer.json
_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128)
_WEIGHTS_FILE = "model.safetensors"
_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen(kw_only=True)
class TinyModelSpec:
    """Shape and seed of the tiny Llama; equal specs always build byte-identical directories.

    Attributes:
        vocab_size: Embedding rows; at least the tokenizer's 4096 tokens.
        hidden_size: Model width; must equal ``num_attention_heads * head_dim``.
        num_hidden_layers: Decoder layers.
        num_attention_heads: Query heads.
        num_key_value_heads: KV heads; must divide ``num_attention_heads``.
        head_dim: One of 32, 64, 80, 96, 112, 128 (the head sizes vLLM's CPU attention supports).
        intermediate_size: MLP width.
        max_position_embeddings: Longest context the config admits.
        seed: Seed of the random weights (``weights="random"``).
        logit_std: Standard deviation of the random model's logits for a unit-RMS final hidden
            state; large enough that greedy top-1 margins dwarf float32 rounding.
    """

    vocab_size: int = attrs.field(default=_TOKENIZER_VOCAB_SIZE)
    hidden_size: int = attrs.field(default=128, validator=_positive)
    num_hidden_layers: int = attrs.field(default=2, validator=_positive)
    num_attention_heads: int = attrs.field(default=2, validator=_positive)
    num_key_value_heads: int = attrs.field(default=2, validator=_positive)
    head_dim: int = attrs.field(default=64)
    intermediate_size: int = attrs.field(default=512, validator=_positive)
    max_position_embeddings: int = attrs.field(default=2048, validator=_positive)
    seed: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
    logit_std: float = attrs.field(default=4.0)

    @vocab_size.validator
    def _check_vocab_size(self, attribute: attrs.Attribute, value: int) -> None:
        if value < _TOKENIZER_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be >= {_TOKENIZER_VOCAB_SIZE}, got {value}")

    @head_dim.validator
    def _check_head_dim(self, attribute: attrs.Attribute, value: int) -> None:
        if value not in _CPU_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {_CPU_HEAD_DIMS}, got {value}")

    @logit_std.validator
    def _check_logit_std(self, attribute: attrs.Attribute, value: float) -> None:
        if not value > 0:
            raise ValueError(f"logit_std must be > 0, got {value}")

    def __attrs_post_init__(self) -> None:
        if self.hidden_size != self.num_attention_heads * self.head_dim:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must equal num_attention_heads * head_dim "
                f"({self.num_attention_heads} * {self.head_dim})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )

    def config(self) -> dict[str, Any]:
        """The ``config.json`` contents: a float32 ``LlamaForCausalLM`` with untied embeddings."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 2,
            "dtype": "float32",
            "use_cache": True,
        }


def tiny_model_dir(
    weights: Literal["dummy", "random"] = "dummy",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    spec: TinyModelSpec | None = None,
) -> pathlib.Path:
    """Return a complete tiny-Llama model directory, building it on first use only.

    The directory is ``<cache root>/tiny-llama-<weights>-<hash>``, where the hash covers the spec
    and every file's recipe, so a change rebuilds into a new directory. It is written into a
    temporary sibling and renamed into place, so concurrent processes never see a partial one.

    Args:
        weights: ``"dummy"`` (config and tokenizer; load with ``load_format="dummy"``) or
            ``"random"`` (also ``model.safetensors`` with seeded random weights).
        cache_dir: Cache root; defaults to ``$LLM_SERVING_POLICIES_CACHE`` or
            ``~/.cache/llm-serving-policies``.
        spec: Model shape and seed; defaults to ``TinyModelSpec()``.

    Returns:
        The model directory, for ``vllm.LLM(model=str(path), ...)``.

    Raises:
        ValueError: If ``weights`` is not ``"dummy"`` or ``"random"``.
    """
    if weights not in ("dummy", "random"):
        raise ValueError(f"weights must be 'dummy' or 'random', got {weights!r}")
    spec = TinyModelSpec() if spec is None else spec
    files = _text_files(spec)
    final = _cache_root(cache_dir) / f"tiny-llama-{weights}-{_digest(spec, weights, files)}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any model dir
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if weights == "random":
            _write_random_weights(spec, tmp / _WEIGHTS_FILE)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not a lost race with another builder: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> pathlib.Path:
    if cache_dir is not None:
        return pathlib.Path(cache_dir)
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".cache" / "llm-serving-policies"


def _digest(spec: TinyModelSpec, weights: str, files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    recipe = {"format": _FORMAT_VERSION, "weights": weights, "spec": attrs.asdict(spec)}
    h.update(json.dumps(recipe, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()[:12]


def _json_bytes(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _text_files(spec: TinyModelSpec) -> dict[str, bytes]:
    """Everything but the weights: config, generation config and tokenizer files."""
    special = {"bos_token": _BOS, "eos_token": _EOS, "pad_token": _PAD}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": _CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    return {
        "config.json": _json_bytes(spec.config()),
        "generation_config.json": _json_bytes(generation_config),
        "tokenizer.json": (_DATA_DIR / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": _json_bytes(tokenizer_config),
        "special_tokens_map.json": _json_bytes(special),
    }


def _write_random_weights(spec: TinyModelSpec, path: pathlib.Path) -> None:
    """Save seeded N(0, std) weights under Hugging Face Llama parameter names."""
    import torch  # local: the dummy flavour needs neither torch nor safetensors
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(spec.seed)
    tensors: dict[str, torch.Tensor] = {}

    def normal(name: str, shape: tuple[int, int], std: float) -> None:
        tensors[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * std

    h, q, kv = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads
    d, m = spec.head_dim, spec.intermediate_size
    normal("model.embed_tokens.weight", (spec.vocab_size, h), 1.0)
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        # Fan-in scaling keeps every activation at unit scale, so attention mixes the context.
        normal(f"{p}.self_attn.q_proj.weight", (q * d, h), 1 / math.sqrt(h))
        normal(f"{p}.self_attn.k_proj.weight", (kv * d, h), 1 / math.sqrt(h))
        normal(f"{p}.self_attn.v_proj.weight", (kv * d, h), 1 / math.sqrt(h))
        normal(f"{p}.self_attn.o_proj.weight", (h, q * d), 1 / math.sqrt(q * d))
        normal(f"{p}.mlp.gate_proj.weight", (m, h), 1 / math.sqrt(h))
        normal(f"{p}.mlp.up_proj.weight", (m, h), 1 / math.sqrt(h))
        normal(f"{p}.mlp.down_proj.weight", (h, m), 1 / math.sqrt(m))
        tensors[f"{p}.input_layernorm.weight"] = torch.ones(h)
        tensors[f"{p}.post_attention_layernorm.weight"] = torch.ones(h)
    tensors["model.norm.weight"] = torch.ones(h)
    normal("lm_head.weight", (spec.vocab_size, h), spec.logit_std / math.sqrt(h))
    save_file(tensors, str(path), metadata={"format": "pt"})
