"""Prefix keys of a request, computed the same way for every replica: what the router matches.

The ingress tokenizes each OpenAI request with the model's tokenizer (the chat
template for ``/v1/chat/completions``), cuts the token ids into blocks of the
engine's KV block size and chains the blocks' hashes (`policies.pd.index.chain_keys`),
so key ``i`` stands for the whole prompt up to block ``i``. Two requests share key
``i`` exactly when they share that prefix of token ids — what vLLM's prefix cache on a
replica can reuse. Keys are hashes of tuples of ints, equal in every process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from integrations.vllm_v1.pd.proxy import request_session_id
from policies.pd.index import chain_keys


@attrs.frozen(kw_only=True)
class RoutingHint:
    """What the request router knows of one request's prompt."""

    prompt_tokens: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Prompt length in tokens (characters / 4 when no tokenizer could be loaded)."""
    block_keys: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    """Chained keys of the prompt's full blocks (see `chain_keys`)."""
    session_id: str | None = None
    """The agent session the request is a turn of (`request_session_id`), if it names one."""
    slo_class: str | None = None
    """The SLO class the body names (``vllm_xargs.slo_class``), if any."""
    tenant: str | None = None
    """The tenant the body names (``vllm_xargs.tenant``), if any."""


def block_keys(token_ids: list[int], block_size_tokens: int) -> tuple[int, ...]:
    """Chained keys of the full blocks of ``token_ids`` (a partial last block has no key)."""
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    blocks = [hash(tuple(token_ids[i:i + block_size_tokens]))
              for i in range(0, len(token_ids) - block_size_tokens + 1, block_size_tokens)]
    return tuple(chain_keys(blocks))


@attrs.define(eq=False, kw_only=True)
class PromptKeys:
    """Turns OpenAI request bodies into `RoutingHint`\\ s with the model's tokenizer.

    Without a tokenizer (``tokenizer=None``, or one that failed to load) the prompt's
    characters stand in for tokens: keys still agree for equal prompt prefixes.
    """

    block_size_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    tokenizer: Any = None
    """A Hugging Face tokenizer (``encode``, ``apply_chat_template``), or None."""

    @classmethod
    def for_model(cls, model: str, block_size_tokens: int) -> PromptKeys:
        """Load ``model``'s tokenizer (offline: a local directory or the hub cache)."""
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model)
        except (OSError, ValueError):
            tokenizer = None
        return cls(block_size_tokens=block_size_tokens, tokenizer=tokenizer)

    def hint(self, endpoint: str, body: Mapping[str, Any]) -> RoutingHint:
        """The hint for a ``completions`` or ``chat/completions`` body (no prompt keys if it
        has no prompt this can read: vLLM answers such a request with its own 400)."""
        xargs = body.get("vllm_xargs")
        xargs = xargs if isinstance(xargs, dict) else {}
        named = {key: xargs[key] for key in ("slo_class", "tenant")
                 if isinstance(xargs.get(key), str)}
        session_id = request_session_id(body)
        units, are_tokens = self.prompt_units(endpoint, body)
        if units is None:
            return RoutingHint(session_id=session_id, **named)
        tokens = len(units) if are_tokens else len(units) // 4 + 1
        return RoutingHint(prompt_tokens=tokens,
                           block_keys=block_keys(units, self.block_size_tokens),
                           session_id=session_id, **named)

    def prompt_units(self, endpoint: str, body: Mapping[str, Any]
                     ) -> tuple[list[int] | None, bool]:
        """The prompt as token ids, or as character codes (then ``False``); None if absent."""
        if endpoint == "completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
                prompt = prompt[0]  # a batch: route by its first prompt
            if isinstance(prompt, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                return list(prompt), True
            if not isinstance(prompt, str):
                return None, False
            if self.tokenizer is None:
                return [ord(c) for c in prompt], False
            return list(self.tokenizer.encode(prompt)), True
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None, False
        if self.tokenizer is not None:
            try:
                ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                         tokenize=True)
                return list(ids["input_ids"] if isinstance(ids, Mapping) else ids), True
            except (ValueError, TypeError, KeyError, AttributeError):
                pass  # no template, or content this template cannot render
        return [ord(c) for c in json.dumps(messages, sort_keys=True)], False
