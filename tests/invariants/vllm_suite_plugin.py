"""A pytest plugin that runs vLLM's own scheduler unit tests against `PolicyScheduler`.

Loaded by `run_vllm_scheduler_tests` into a pytest process whose rootdir is a scratch copy
of vLLM's ``tests/`` (never committed here). It changes that test process only:

* ``--scheduler-under-test=stock`` runs vLLM's tests as they are; ``identity`` swaps vLLM's
  ``Scheduler`` / ``AsyncScheduler`` for `PolicyScheduler` / `AsyncPolicyScheduler` with no
  pipeline configured (what ``--scheduler-cls`` alone gives); any other value is a preset name
  (``default``, ``wfq``, ...) put in the scheduler's ``additional_config`` as vLLM's
  ``--additional-config`` would;
* Hugging Face model ids the tests name are resolved to local ``config.json`` directories
  (no hub here); ids with no local config are left alone and fail offline.

The swap replaces the module globals ``Scheduler`` and ``AsyncScheduler`` of vLLM's test
modules (``tests.v1.*``) after collection, so every helper that builds a scheduler
(``create_scheduler`` and the tests' own constructors) builds ours.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

OPT_125M_CONFIG = {
    "activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
    "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
    "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 768,
}
"""``facebook/opt-125m``'s public ``config.json`` (what vLLM's tests build schedulers from)."""

OPT_350M_CONFIG = {
    **OPT_125M_CONFIG, "do_layer_norm_before": False, "ffn_dim": 4096, "hidden_size": 1024,
    "num_attention_heads": 16, "num_hidden_layers": 24, "word_embed_proj_dim": 512,
}
"""``facebook/opt-350m``'s public ``config.json``."""

LOCAL_CONFIGS = {"facebook/opt-125m": OPT_125M_CONFIG, "facebook/opt-350m": OPT_350M_CONFIG}
"""Hub ids resolved to a local directory holding only this ``config.json``."""

TENANT_WEIGHTS = {"t0": 4.0, "t1": 2.0, "t2": 1.0}
"""Handed to presets that weigh tenants (vLLM's tests have no tenants: all weigh 1)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--scheduler-under-test", default="stock",
                     help="stock, identity, or a pipeline preset name")


def _local_model(model: str, root: Path) -> str:
    config = LOCAL_CONFIGS.get(model)
    if config is None:
        return model
    path = root / model.replace("/", "--")
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _model_config_factory(model_config_cls: type, root: Path) -> Any:
    def model_config(*args: Any, **kwargs: Any) -> Any:
        if "model" in kwargs:
            kwargs["model"] = _local_model(kwargs["model"], root)
        return model_config_cls(*args, **kwargs)
    return model_config


def _policy_classes(name: str) -> tuple[type, type]:
    from integrations.vllm_v1.config.spec import CONFIG_KEY
    from integrations.vllm_v1.scheduling.scheduler import AsyncPolicyScheduler, PolicyScheduler

    entry = None if name == "identity" else {"pipeline": name, "tenant_weights": TENANT_WEIGHTS}

    def configured(base: type) -> type:
        def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
            if entry is not None:
                vllm_config.additional_config = {**(vllm_config.additional_config or {}),
                                                 CONFIG_KEY: entry}
            base.__init__(self, vllm_config, *args, **kwargs)
        return type(base.__name__, (base,), {"__init__": __init__,
                                              "__module__": __name__})

    return configured(PolicyScheduler), configured(AsyncPolicyScheduler)


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config.stash[_UNDER_TEST] = config.getoption("--scheduler-under-test")


_UNDER_TEST = pytest.StashKey[str]()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    from integrations.vllm_v1.vllm_surface.names import ModelConfig

    under_test = config.stash[_UNDER_TEST]
    classes = None if under_test == "stock" else _policy_classes(under_test)
    root = Path(config.cache.mkdir("local-models"))
    model_config = _model_config_factory(ModelConfig, root)
    for name, module in list(sys.modules.items()):
        if not name.startswith("tests.v1.") or module is None:
            continue
        namespace = vars(module)
        if namespace.get("ModelConfig") is ModelConfig:
            namespace["ModelConfig"] = model_config
        if classes is not None:
            if "Scheduler" in namespace:
                namespace["Scheduler"] = classes[0]
            if "AsyncScheduler" in namespace:
                namespace["AsyncScheduler"] = classes[1]


def pytest_report_header(config: pytest.Config) -> str:
    return f"scheduler under test: {config.stash[_UNDER_TEST]}"
